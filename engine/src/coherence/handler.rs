//! The handler: applies every incoming message, in order per sender, and retries those that
//! could not be applied yet.
//!
//! Handling is a **role**: one holder at a time runs a round (so per-sender order is kept
//! exactly as the model assumes), whoever that is: the node's handler thread, or a thread that
//! waits for an answer and takes the role when it is free ([`Coherence::help`]): a worker of
//! this node in a remote miss, or on `mem` a worker of another node whose answer this node must
//! produce. The handler thread is the fallback that guarantees progress when nobody waits.

use super::possession::Pending;
use super::protocol::{bit, members, Msg, Node};
use super::wire::{decode_batch, Attached, Control, Wire, CONTROL_BASE, REFUSE_HOLDER_DEAD};
use super::{failure::refusal, msg_has_page, Coherence, Data, Note, PageState, Receipt};
use crate::buffer::Buffer;
use crate::pid::Pid;
use shoal_messaging::Incoming;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Most incoming messages one round applies before it retries held ones again.
const ROUND: usize = 64;

/// What the holder of the handler role keeps between rounds.
#[derive(Default)]
pub(super) struct Role {
    /// Nodes seen dead (their pages were swept once).
    dead_seen: u64,
    /// Nodes seen dead whose fence did not hold yet (`lease.rs`): offers to them, and requests
    /// that would need them as sharers, still wait.
    fence_due: u64,
    /// Per node, the transport's connection to it when the last round looked
    /// (`Transport::connection`): a new one is a restarted node taken back (`rejoin.rs`),
    /// whose old incarnation's death was handled; it starts afresh.
    connections: Vec<u64>,
}

impl Role {
    /// Whether `n`'s death was handled here: noticed (its pages swept) and fenced.
    pub(super) fn handled(&self, n: Node) -> bool {
        self.dead_seen & bit(n) != 0 && self.fence_due & bit(n) == 0
    }
}

/// What a round did.
struct Round {
    /// Incoming messages applied.
    applied: usize,
    /// Held messages or allocations were retried (more may follow soon).
    retried: bool,
}

impl Coherence {
    /// Decode and queue an incoming message, then apply what can be applied.
    fn receive(&self, buf: &Buffer, inc: Incoming) {
        let from = inc.env.from_node;
        let kind = inc.env.kind;
        if kind >= CONTROL_BASE {
            match (inc.env.decode::<Control>(), inc.page) {
                (Ok(Control::Batch { count }), Some(page)) => match decode_batch(count, &page) {
                    Ok(msgs) => {
                        for (pid, msg) in msgs {
                            // (batches carry only messages without a page)
                            match attach(msg, None) {
                                Some(m) => self.deliver(buf, from, Pid(pid), m, Receipt::Nothing),
                                None => log::error!(
                                    "node {}: a page message in a batch from node {from}: dropped",
                                    self.me
                                ),
                            }
                        }
                    }
                    Err(e) => log::error!("node {}: bad batch from node {from}: {e}", self.me),
                },
                (Ok(c), None) if !matches!(c, Control::Batch { .. }) => {
                    self.on_control(buf, from, c)
                }
                (Ok(c), _) => log::error!(
                    "node {}: {c:?} from node {from} with a page attachment mismatch: dropped",
                    self.me
                ),
                (Err(e), _) => {
                    log::error!("node {}: bad control message from {from}: {e}", self.me)
                }
            }
            return;
        }
        let w: Wire = match inc.env.decode() {
            Ok(w) => w,
            Err(e) => {
                log::error!("node {}: malformed message from node {from}: {e}", self.me);
                return;
            }
        };
        let pid = Pid(w.pid);
        let has = msg_has_page(&w.msg);
        let data = match (has, inc.page, from == self.me) {
            (true, _, true) => Some(Data::Home),
            (true, Some(p), false) => Some(Data::Bytes(p)),
            (false, None, _) => None,
            (true, None, false) | (false, Some(_), _) => {
                log::error!(
                    "node {}: {} from node {from} for {pid} with a page attachment mismatch: dropped",
                    self.me,
                    w.msg.name()
                );
                return;
            }
        };
        let logged = match &data {
            // before anything else of ours can make the page leave again (see logged.rs)
            Some(Data::Bytes(p)) => self.log_received(pid, &w.msg, p),
            _ => Receipt::Nothing,
        };
        let Some(msg) = attach(w.msg, data) else {
            unreachable!("the page was checked against the message above")
        };
        self.deliver(buf, from, pid, msg, logged);
    }

    /// Queue a decoded message about `pid` (`logged`: what the log holds of the page it
    /// brought) and apply what can be applied.
    fn deliver(&self, buf: &Buffer, from: Node, pid: Pid, msg: Msg<Data>, logged: Receipt) {
        if pid.node() >= self.nodes {
            log::error!(
                "node {}: {} from {from} about {pid}, outside the cluster",
                self.me,
                msg.name()
            );
            return;
        }
        let mut shard = self.pages.shard(pid).lock();
        let ps = shard
            .entry(pid)
            .or_insert_with(|| PageState::new(pid, self.me));
        ps.held.push_back(Note { from, msg, logged });
        if self.progress(buf, pid, ps) {
            self.pages.retry_later(pid);
        }
        ps.debug_check(pid, self.me);
        Self::wake(ps);
    }

    fn on_control(&self, buf: &Buffer, from: Node, c: Control) {
        match c {
            Control::Arrive { generation } => {
                self.barrier.arrive(from, generation);
                self.waiting.notify();
            }
            Control::Alloc { request } => self.alloc_asked(buf, from, request),
            Control::Allocated { request, pid } => self.alloc_answered(from, request, pid),
            Control::Unused { pid } => self.free_unused(buf, from, Pid(pid)),
            Control::Room { frames } => self.room_of(from, frames),
            Control::LogFence { seq } => self.on_log_fence(from, seq),
            Control::LogFenced { seq } => self.on_log_fenced(from, seq),
            Control::Ping { at } => self.on_ping(from, at),
            Control::Pong { at } => self.on_pong(from, at),
            Control::Lost { pid, node } => {
                let pid = Pid(pid);
                if pid.node() == self.me {
                    let mut shard = self.pages.shard(pid).lock();
                    let ps = shard
                        .entry(pid)
                        .or_insert_with(|| PageState::new(pid, self.me));
                    // the reporter, named the holder (or the chain's middle node), never got
                    // it: it died with `node`. Also when the page is lost here already (the
                    // reporter's refusal of this node's own hand-over arrives before its
                    // report, on the same channel), so that it can be brought back when
                    // `node` restarts (seen in 2 of 20 kills)
                    if ps.lost.is_none_or(|n| n == node) {
                        ps.dir.died_with(from, node);
                    }
                    if ps.lost.is_none() {
                        log::error!(
                            "node {}: page {pid} is lost with node {node} (reported by node {from})",
                            self.me
                        );
                        self.mark_lost_home(pid, ps, node);
                    }
                    Self::wake(ps);
                }
            }
            Control::Found { pid } => {
                let pid = Pid(pid);
                if pid.node() != from {
                    log::error!(
                        "node {}: node {from} says page {pid} was brought back, which only its \
                         home may say; ignored",
                        self.me
                    );
                    return;
                }
                if !self.driver.ch.peer_alive(from) {
                    // the home died after it sent it: a loss with it stands, and whatever
                    // the home sent after it is void (found by the model check: a grant of
                    // the dead home's, applied after, met a copy that no longer asked)
                    return;
                }
                let mut shard = self.pages.shard(pid).lock();
                let ps = shard
                    .entry(pid)
                    .or_insert_with(|| PageState::new(pid, self.me));
                if ps.lost.is_some() {
                    // (its copy ended with the loss: `lose`)
                    ps.lost = None;
                    ps.error = None;
                    ps.page_from = None;
                }
                // the home may list this node as a sharer without a copy: invalidations are
                // answered at once from now on (one that waited, at the next round)
                if ps.copy.data.is_none() {
                    ps.copy.maybe_listed = true;
                    if !ps.copy.deferred.is_empty() {
                        ps.serve_due = true;
                        self.pages.retry_later(pid);
                    }
                }
                Self::wake(ps);
                drop(shard);
                self.send_control(from, &Control::FoundAck { pid: pid.raw() });
            }
            Control::FoundAck { pid } => {
                let pid = Pid(pid);
                if pid.node() == self.me {
                    let mut shard = self.pages.shard(pid).lock();
                    if let Some(ps) = shard.get_mut(&pid) {
                        if ps.dir.settled(from) {
                            self.requeue_deferred(ps);
                            self.pages.retry_later(pid);
                        }
                        Self::wake(ps);
                    }
                }
            }
            Control::Ask { pid } => self.on_ask(from, Pid(pid)),
            Control::Has { pid, holds } => self.on_has(from, Pid(pid), holds),
            Control::Settle { node, seq } => self.on_settle(buf, from, node, seq),
            Control::Settled { node, seq, done } => self.settles.answered(from, node, seq, done),
            Control::Batch { .. } => {
                unreachable!("receive unpacks batches")
            }
            Control::Refuse { pid, code, node } => {
                let pid = Pid(pid);
                let mut shard = self.pages.shard(pid).lock();
                if let Some(s) = shard.get_mut(&pid) {
                    if code == REFUSE_HOLDER_DEAD
                        && matches!(
                            s.copy.pending,
                            Pending::Completing { .. } | Pending::Evicting
                        )
                    {
                        // our predecessor in the page's chain lost it, or (to an eviction
                        // notice) its home marked it lost
                        self.lose(buf, pid, s, node);
                    } else if matches!(s.copy.pending, Pending::Requested { .. }) {
                        // the home did not record us: the request is over
                        self.request_over(pid, s);
                        s.error = Some(refusal(pid, code, node, from));
                    }
                    Self::wake(s);
                }
            }
        }
    }

    /// Retry the held messages of `pid`.
    pub(super) fn kick(&self, buf: &Buffer, pid: Pid) {
        let mut shard = self.pages.shard(pid).lock();
        if let Some(ps) = shard.get_mut(&pid) {
            if self.progress(buf, pid, ps) {
                self.pages.retry_later(pid);
            }
            ps.debug_check(pid, self.me);
            Self::wake(ps);
        }
    }

    /// One round of the handler's job, by whoever holds the role: notice deaths, retry held
    /// messages, serve waiting allocations, apply up to [`ROUND`] incoming messages, send the
    /// round's batches. Returns what it did.
    fn round(&self, buf: &Buffer, role: &mut Role) -> Round {
        self.notice_rejoins(role);
        let dead = (0..self.nodes)
            .filter(|&n| n != self.me && !self.driver.ch.peer_alive(n))
            .fold(0u64, |m, n| m | (1 << n));
        if dead & !role.dead_seen != 0 {
            let new = dead & !role.dead_seen;
            self.settles.died(new);
            self.driver
                .counters
                .deaths_noticed
                .fetch_add(u64::from(new.count_ones()), Ordering::Relaxed);
            role.fence_due |= new;
            role.dead_seen |= dead;
            self.sweep_dead(buf);
        }
        if role.fence_due != 0 {
            // fenced, and everything it sent handled (its last notices count)
            let drained = self.driver.dead_drained.load(Ordering::Acquire);
            let fenced = members(role.fence_due & drained)
                .filter(|&n| self.leases.fence_holds(n))
                .fold(0, |set, n| set | bit(n));
            if fenced != 0 {
                role.fence_due &= !fenced;
                self.after_fence(buf, fenced);
            }
        }
        let retry: Vec<Pid> = self.pages.retry.take();
        let retried = !retry.is_empty() | self.serve_allocs(buf);
        for pid in retry {
            self.kick(buf, pid);
        }
        let mut applied = 0;
        while let Some(inc) = self.driver.ch.try_recv() {
            self.receive(buf, inc);
            applied += 1;
            if applied == ROUND {
                break;
            }
        }
        // the eviction replies of this round leave together
        self.flush_batches();
        self.restore_unsent(buf);
        if applied < ROUND && dead != 0 {
            // This round began after `dead` was seen (an Acquire load of each peer's liveness,
            // which its transport clears only after storing everything the peer sent), and it
            // drained the rings empty: all those messages are handled. Release: see
            // `dead_drained`.
            self.driver.dead_drained.fetch_or(dead, Ordering::Release);
        }
        Round { applied, retried }
    }

    /// A node taken back since the last round (a new connection, `rejoin.rs`): what this node
    /// kept about its old incarnation's death goes, so that a death of the new one is noticed
    /// and handled as any other.
    fn notice_rejoins(&self, role: &mut Role) {
        let t = self.driver.ch.transport();
        if role.connections.len() != self.nodes as usize {
            role.connections = (0..self.nodes).map(|n| t.connection(n)).collect();
            return;
        }
        for n in 0..self.nodes {
            let c = t.connection(n);
            if c != role.connections[n as usize] {
                role.connections[n as usize] = c;
                role.dead_seen &= !bit(n);
                role.fence_due &= !bit(n);
                // Release: as where it is set (`round`)
                self.driver
                    .dead_drained
                    .fetch_and(!bit(n), Ordering::Release);
                if self.driver.ch.peer_alive(n) {
                    self.tell_barriers(n);
                }
            }
        }
    }

    /// Take the handler role if it is free and messages wait, and run a round: for threads
    /// that wait for an answer (a worker's remote miss, on `mem` also another node's worker,
    /// through [`shoal_messaging::Region::serve`]), so that they do the handler's work instead
    /// of waking it. Returns whether the round applied any message. Does nothing once the node
    /// stops (`Engine::close` takes the role after setting `stop`, so no round runs after it).
    pub fn help(&self, buf: &Buffer) -> bool {
        // home copies to read come first, outside the role (several helpers read in parallel)
        let read = !self.driver.stop.load(Ordering::Acquire) && self.do_store_reads(buf);
        if !read && !self.driver.ch.pending() && self.pages.retry.is_empty() {
            return false;
        }
        let Some(mut role) = self.driver.role.try_lock() else {
            return read;
        };
        if self.driver.stop.load(Ordering::Acquire) {
            return false;
        }
        let applied = self.round(buf, &mut role).applied;
        drop(role);
        self.driver
            .counters
            .helped
            .fetch_add(applied as u64, Ordering::Relaxed);
        // the round may have asked for store reads: do them now (the answer waits for them)
        (applied > 0) | self.do_store_reads(buf) | read
    }

    /// Wait for a round in progress (by a helper) to end; with `stop` set, no round starts
    /// after it ([`Coherence::help`]).
    pub fn quiesce(&self) {
        debug_assert!(self.driver.stop.load(Ordering::Acquire));
        drop(self.driver.role.lock());
    }

    /// The handler thread of a node: rounds until the node stops, waiting for messages
    /// between rounds that found nothing.
    pub fn run_handler(&self, buf: &Buffer) {
        while !self.driver.stop.load(Ordering::Acquire) {
            let r = {
                let mut role = self.driver.role.lock();
                self.round(buf, &mut role)
            };
            // the round's store reads, outside the role (helpers may take some of them)
            let read = self.do_store_reads(buf);
            // leases: the handler thread runs even when no worker of this node does
            self.ping_peers();
            if r.applied == 0 && !read {
                let t = if r.retried || !self.pages.retry.is_empty() {
                    Duration::from_micros(50)
                } else {
                    Duration::from_millis(10)
                };
                self.driver.ch.wait(t, &self.driver.stop);
            }
        }
    }
}

/// The same message with `data` as its page; `None` if the message carries a page and `data`
/// is none (or the reverse).
fn attach(m: Msg<Attached>, data: Option<Data>) -> Option<Msg<Data>> {
    if msg_has_page(&m) != data.is_some() {
        return None;
    }
    let mut data = data;
    Some(m.map_data(|_| data.take().unwrap_or(Data::Home)))
}
