//! Channels: one-way streams of 64-byte messages (each optionally carrying one 4 KiB page)
//! between every pair of nodes, over one-sided writes.
//!
//! Mailboxes ([`crate::mailbox`]) are request/response: a worker waits for the reply to its
//! request. A coherence protocol also sends to third parties (a requester asks the node its
//! home pointed it at; a sharer acknowledges an invalidation to the node that sent it) and its
//! handlers must never wait for an answer. Channels serve that: `send` returns once the
//! message is written, and the receiver's handler drains its rings whenever it likes.
//!
//! Region layout of every node (see [`ChannelLayout`]):
//!
//! ```text
//! credit slots   nodes x 64 B            slot p: how much of our stream node p has consumed
//! message rings  nodes x ring x 64 B     ring s: messages from node s
//! (padding to 4 KiB)
//! page rings     nodes x pages x 4 KiB   ring s: pages from node s
//! ```
//!
//! **Sending** (node `s` to `d`, under `s`'s lock for `d`): if `d` has room (credit) for it,
//! write the page (if any) into the next slot of `d`'s page ring for `s`, then the message
//! into the next slot of `d`'s message ring for `s`. Writes to one peer are applied in order,
//! so the page is complete when the message's flag (its last byte, written last) is seen; both
//! go in one [`Transport::write_two`] (over tcp, one system call). A message's `from_worker`
//! field carries the channel's flags (bit 0: a page is attached), its `seq` the message's
//! position in the stream, which the receiver checks.
//!
//! **A send never waits.** Without room, the message (and a copy of its page) joins the
//! peer's **backlog**, and so does every later message to that peer until the backlog is
//! empty again: the stream's order is the order of the sends. The backlog leaves as credit
//! comes back, written by the next send to that peer or by [`Channels::flush`], which every
//! [`Channels::drain`] and [`Channels::try_recv`] runs (a node's handler keeps draining).
//! No thread therefore ever holds a lock while it waits for a peer: a tcp reader thread, the
//! only one that lands the credit a peer returns, may run the node's handler round, whose
//! sends could otherwise wait for that very credit. A backlog whose first message waited the
//! credit timeout without the peer taking anything gives the peer up ([`Transport::sever`]),
//! as a full ring did before. The backlog's size is bounded by what the node above sends
//! without an answer; the engine's provider sends no more pages to a node whose backlog holds
//! [`BACKLOG_PAGES`] (see [`Channels::backlog_pages`]).
//!
//! **Receiving** ([`Channels::drain`]): for each source, read the messages whose flag is set,
//! in ring order, copy attached pages out (pages are consumed in the order they were sent),
//! clear the slots, queue the messages in a local inbox, and, once half a ring of messages or
//! of pages was consumed since the last time, write the consumed counts into the sender's
//! credit slot. Any thread may drain; a sender short of credit drains while it waits, so two
//! nodes whose rings are full cannot wait for each other forever.
//!
//! It knows nothing about what the messages mean.

use crate::error::MsgError;
use crate::mailbox::PAGE_BYTES;
use crate::message::{Envelope, Message, FULL, MSG_BYTES};
use crate::region::{Region, SLOT_BYTES};
use crate::transport::Transport;
use crate::wait::WaitMode;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `from_worker` flag: a page is attached.
const HAS_PAGE: u16 = 1;

/// Pages in a peer's backlog beyond which the engine's provider stops sending that peer
/// evicted pages until it shrinks (the backlog's only large user; the rest is answers and
/// requests, bounded by the workers waiting for them).
pub const BACKLOG_PAGES: usize = 64;

/// Shape of every node's channel region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelLayout {
    pub nodes: u8,
    /// Message slots per source.
    pub ring: u32,
    /// Page slots per source.
    pub pages: u32,
}

impl ChannelLayout {
    /// A layout with the default ring sizes (512 messages, 32 pages per source).
    pub fn new(nodes: u8) -> ChannelLayout {
        ChannelLayout {
            nodes,
            ring: 512,
            pages: 32,
        }
    }

    pub fn validate(&self) -> Result<(), MsgError> {
        if self.nodes == 0 || self.nodes > 64 {
            return Err(MsgError::Config(format!(
                "a cluster has 1 to 64 nodes, got {}",
                self.nodes
            )));
        }
        if self.ring < 2 || self.pages < 1 {
            return Err(MsgError::Config(
                "channels need at least 2 message slots and 1 page slot per source".into(),
            ));
        }
        Ok(())
    }
    fn credit_off(&self, peer: u8) -> usize {
        peer as usize * SLOT_BYTES
    }
    fn ring_off(&self, src: u8, seq: u64) -> usize {
        debug_assert!(src < self.nodes, "a ring of a node of the cluster");
        let off = (self.nodes as usize
            + src as usize * self.ring as usize
            + (seq % self.ring as u64) as usize)
            * SLOT_BYTES;
        debug_assert!(
            off + SLOT_BYTES <= self.slots() * SLOT_BYTES,
            "a ring slot lies before the pages"
        );
        off
    }
    fn slots(&self) -> usize {
        self.nodes as usize * (1 + self.ring as usize)
    }
    fn page_off(&self, src: u8, seq: u64) -> usize {
        debug_assert!(src < self.nodes, "a page ring of a node of the cluster");
        self.pages_off()
            + (src as usize * self.pages as usize + (seq % self.pages as u64) as usize) * PAGE_BYTES
    }
    /// Where the page rings begin (after the message slots, on a page boundary).
    fn pages_off(&self) -> usize {
        (self.slots() * SLOT_BYTES).div_ceil(PAGE_BYTES) * PAGE_BYTES
    }
    /// Bytes of the region.
    pub fn region_bytes(&self) -> usize {
        self.pages_off() + self.nodes as usize * self.pages as usize * PAGE_BYTES
    }
    /// A zeroed region of this layout; every slot wakes wait queue 0 (the node's handler).
    pub fn region(&self) -> Result<Region, MsgError> {
        self.validate()?;
        Region::new(self.region_bytes(), vec![0; self.slots()], 1)
    }
}

/// A received message and its page.
#[derive(Debug)]
pub struct Incoming {
    pub env: Envelope,
    pub page: Option<Box<[u8; PAGE_BYTES]>>,
}

/// Messages and pages of one stream, sent or consumed so far.
#[derive(Default, Clone, Copy)]
struct Sent {
    msgs: u64,
    pages: u64,
}

/// A message that had no room yet, with a copy of its page.
struct Waiting {
    env: Envelope,
    page: Option<Box<[u8; PAGE_BYTES]>>,
}

/// Our stream to one peer: what was written, and what waits for room, in order.
#[derive(Default)]
struct Outgoing {
    sent: Sent,
    backlog: VecDeque<Waiting>,
    /// Pages among `backlog`.
    pages: usize,
    /// Since when the backlog's first message waits without the peer taking anything.
    since: Option<Instant>,
}

/// What we consumed of one source's stream, and how much of that we told the source.
#[derive(Default)]
struct Received {
    consumed: Sent,
    credited: Sent,
}

/// One node's channels to every node (itself included: a message to oneself goes straight to
/// the inbox).
pub struct Channels {
    t: Arc<dyn Transport>,
    layout: ChannelLayout,
    mode: WaitMode,
    /// Per peer: what we sent it, and what waits for room.
    sent: Box<[Mutex<Outgoing>]>,
    /// Messages in every backlog, for readers that take no lock. Changed under the peer's
    /// `sent` lock.
    backlogged: AtomicUsize,
    /// Per source: what we consumed of its stream (`msgs`, `pages`).
    received: Mutex<Box<[Received]>>,
    /// Per source: `received[s].msgs` for readers that take no lock ([`Channels::pending`]).
    /// Stored (Release) after the message's slot was read and freed.
    next: Box<[AtomicU64]>,
    inbox: Mutex<VecDeque<Incoming>>,
    /// Messages in `inbox`, for readers that take no lock. Changed under the inbox's lock,
    /// after the push and after the pop.
    queued: AtomicUsize,
    /// How long a sender waits for credit before giving up.
    pub credit_timeout: Duration,
}

impl Channels {
    pub fn new(
        t: Arc<dyn Transport>,
        layout: ChannelLayout,
        mode: WaitMode,
    ) -> Result<Channels, MsgError> {
        layout.validate()?;
        if t.nodes() != layout.nodes || t.region().len() < layout.region_bytes() {
            return Err(MsgError::Config(
                "the transport's cluster or region does not match the channel layout".into(),
            ));
        }
        let n = layout.nodes as usize;
        Ok(Channels {
            t,
            layout,
            mode,
            sent: (0..n).map(|_| Mutex::new(Outgoing::default())).collect(),
            backlogged: AtomicUsize::new(0),
            received: Mutex::new((0..n).map(|_| Received::default()).collect()),
            next: (0..n).map(|_| AtomicU64::new(0)).collect(),
            inbox: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
            credit_timeout: Duration::from_secs(10),
        })
    }

    pub fn node(&self) -> u8 {
        self.t.node()
    }
    pub fn nodes(&self) -> u8 {
        self.layout.nodes
    }
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.t
    }
    pub fn peer_alive(&self, peer: u8) -> bool {
        peer == self.t.node() || self.t.peer_alive(peer)
    }

    /// How much of our stream `peer` has consumed (messages, pages).
    fn credit(&self, peer: u8) -> (u64, u64) {
        let off = self.layout.credit_off(peer);
        let r = self.t.region();
        // Acquire loads (Region::load): the counters only grow, a stale value is conservative.
        (r.load(off), r.load(off + 8))
    }

    /// Send `env` (its `from_node`, `from_worker` and `seq` are set here) with an optional page
    /// to `peer`. Never waits: without room in `peer`'s rings the message joins its backlog
    /// (module doc). Fails if `peer` is dead, or was just given up on because its backlog
    /// waited the credit timeout.
    pub fn send(
        &self,
        peer: u8,
        mut env: Envelope,
        page: Option<&[u8; PAGE_BYTES]>,
    ) -> Result<(), MsgError> {
        let me = self.t.node();
        if peer >= self.layout.nodes {
            return Err(MsgError::NoSuchPeer(peer, self.layout.nodes));
        }
        env.from_node = me;
        env.from_worker = if page.is_some() { HAS_PAGE } else { 0 };
        if peer == me {
            env.seq = 0;
            self.queue(Incoming {
                env,
                page: page.map(|p| Box::new(*p)),
            });
            self.t.region().wake_unless_helped(0);
            return Ok(());
        }
        let mut o = self.sent[peer as usize].lock();
        self.flush_locked(peer, &mut o)?;
        if o.backlog.is_empty() && self.room(peer, &o.sent, page.is_some())? {
            return self.write_locked(peer, &mut o.sent, env, page);
        }
        if !self.t.peer_alive(peer) {
            return Err(MsgError::PeerDead(peer));
        }
        o.backlog.push_back(Waiting {
            env,
            page: page.map(|p| Box::new(*p)),
        });
        o.pages += usize::from(page.is_some());
        o.since.get_or_insert_with(Instant::now);
        self.backlogged.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Whether `peer`'s rings have room for one more message (with a page if `page`). Fails,
    /// giving the peer up, if its credit says it consumed more than was sent.
    fn room(&self, peer: u8, s: &Sent, page: bool) -> Result<bool, MsgError> {
        let (msgs, pages) = self.credit(peer);
        if msgs > s.msgs || pages > s.pages {
            // the peer says it consumed more than we sent: its credit slot is corrupt, and
            // nothing it says about the stream can be trusted any more
            log::error!(
                "node {}: node {peer} returned credit for {msgs} messages and {pages} pages, \
                 {} and {} were sent: giving up on it",
                self.t.node(),
                s.msgs,
                s.pages
            );
            self.t.sever(peer);
            return Err(MsgError::Decode(format!(
                "node {peer}'s credit runs ahead of what was sent"
            )));
        }
        Ok(s.msgs - msgs < self.layout.ring as u64
            && (!page || s.pages - pages < self.layout.pages as u64))
    }

    /// Write one message (and its page) into `peer`'s rings; the caller checked the room.
    fn write_locked(
        &self,
        peer: u8,
        s: &mut Sent,
        mut env: Envelope,
        page: Option<&[u8; PAGE_BYTES]>,
    ) -> Result<(), MsgError> {
        let me = self.t.node();
        env.seq = s.msgs as u32;
        let msg = (self.layout.ring_off(me, s.msgs), &env.to_bytes()[..]);
        match page {
            // the page first: the message's flag, written last, says both arrived
            Some(p) => {
                let at = self.layout.page_off(me, s.pages);
                self.t.write_two(peer, (at, &p[..]), msg)?;
                s.pages += 1;
            }
            None => self.t.write(peer, msg.0, msg.1)?,
        }
        s.msgs += 1;
        debug_assert!(
            s.msgs.saturating_sub(self.credit(peer).0) <= self.layout.ring as u64,
            "never more messages in flight than the ring holds"
        );
        Ok(())
    }

    /// Write as much of `peer`'s backlog as its rings have room for. Gives the peer up if the
    /// backlog's first message waited the credit timeout while the peer took nothing; drops
    /// the backlog of a dead peer (its messages are lost with it, as those in flight).
    fn flush_locked(&self, peer: u8, o: &mut Outgoing) -> Result<(), MsgError> {
        if o.backlog.is_empty() {
            return Ok(());
        }
        let r = self.flush_backlog(peer, o);
        if r.is_err() || !self.t.peer_alive(peer) {
            let n = o.backlog.len();
            o.backlog.clear();
            o.pages = 0;
            o.since = None;
            self.backlogged.fetch_sub(n, Ordering::Release);
            r?;
            return Err(MsgError::PeerDead(peer));
        }
        Ok(())
    }

    fn flush_backlog(&self, peer: u8, o: &mut Outgoing) -> Result<(), MsgError> {
        let mut moved = false;
        while let Some(w) = o.backlog.front() {
            if !self.room(peer, &o.sent, w.page.is_some())? {
                break;
            }
            let Some(w) = o.backlog.pop_front() else {
                break;
            };
            o.pages -= usize::from(w.page.is_some());
            self.backlogged.fetch_sub(1, Ordering::Release);
            self.write_locked(peer, &mut o.sent, w.env, w.page.as_deref())?;
            moved = true;
        }
        if o.backlog.is_empty() {
            o.since = None;
        } else if moved {
            o.since = Some(Instant::now());
        } else if o.since.is_some_and(|t| t.elapsed() >= self.credit_timeout) {
            // The messages are lost to a peer that looks alive: the protocols above assume
            // every message arrives, so the link goes (both ends then see a dead node).
            log::error!(
                "node {}: node {peer} took no message for {} ms: giving up on it",
                self.t.node(),
                self.credit_timeout.as_millis()
            );
            self.t.sever(peer);
            return Err(MsgError::Timeout {
                peer,
                ms: self.credit_timeout.as_millis() as u64,
            });
        }
        Ok(())
    }

    /// Write what the peers' rings have room for of every backlog (a peer whose stream
    /// another thread is writing right now is left to that thread's next send or flush).
    /// Errors are the peers' deaths, which their own paths report; they are logged here.
    pub fn flush(&self) {
        if self.backlogged.load(Ordering::Acquire) == 0 {
            return;
        }
        for peer in 0..self.layout.nodes {
            let Some(mut o) = self.sent[peer as usize].try_lock() else {
                continue;
            };
            if let Err(e) = self.flush_locked(peer, &mut o) {
                log::debug!("node {}: backlog to node {peer}: {e}", self.t.node());
            }
        }
    }

    /// Messages waiting in the backlogs of every peer.
    pub fn backlogged(&self) -> usize {
        self.backlogged.load(Ordering::Acquire)
    }

    /// Pages waiting in `peer`'s backlog.
    pub fn backlog_pages(&self, peer: u8) -> usize {
        if self.backlogged() == 0 {
            return 0; // the usual case, without the peer's lock
        }
        self.sent.get(peer as usize).map_or(0, |o| o.lock().pages)
    }

    /// Flush and drain until every backlog left or `limit` passed (a node about to leave the
    /// cluster). Returns whether every backlog left.
    pub fn flush_all(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            self.drain();
            if self.backlogged() == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Forget both streams with dead peer `peer`, which is about to connect again as a new
    /// incarnation (a restarted process, [`crate::RejoinHook`]): its new streams start at
    /// message and page 0 both ways. Our stream to it: counters to zero, backlog dropped (lost
    /// with the old incarnation, as messages in flight are), its credit slot here zeroed. Its
    /// stream to us: counters to zero, every message slot of its ring here cleared, and its
    /// messages still in the inbox dropped (they came from the old incarnation).
    ///
    /// The transport calls it while `peer` is dead, so nobody sends to it meanwhile, and
    /// before any frame of the new connection lands, so the slots cleared here are the old
    /// incarnation's.
    pub fn reset_peer(&self, peer: u8) {
        let me = self.t.node();
        if peer == me || peer >= self.layout.nodes {
            return;
        }
        debug_assert!(!self.t.peer_alive(peer), "a peer is reset while it is dead");
        let r = self.t.region();
        {
            let mut o = self.sent[peer as usize].lock();
            let n = o.backlog.len();
            *o = Outgoing::default();
            self.backlogged.fetch_sub(n, Ordering::Release);
            let off = self.layout.credit_off(peer);
            r.store(off, 0);
            r.store(off + 8, 0);
        }
        let mut rx = self.received.lock();
        rx[peer as usize] = Received::default();
        for seq in 0..self.layout.ring as u64 {
            let off = self.layout.ring_off(peer, seq);
            for word in 0..(SLOT_BYTES / 8) {
                r.store(off + word * 8, 0);
            }
        }
        // Release: a reader of `next` that then loads a slot's flag sees it cleared
        self.next[peer as usize].store(0, Ordering::Release);
        let mut inbox = self.inbox.lock();
        inbox.retain(|m| m.env.from_node != peer);
        self.queued.store(inbox.len(), Ordering::Release);
    }

    /// Send a typed message (see [`Channels::send`]): the channel fills in the header.
    pub fn send_msg<M: Message>(
        &self,
        peer: u8,
        m: &M,
        page: Option<&[u8; PAGE_BYTES]>,
    ) -> Result<(), MsgError> {
        self.send(peer, Envelope::of(m), page)
    }

    /// Write what our backlogs have room for ([`Channels::flush`]), move every complete
    /// message from the rings into the inbox and return credit to the senders. Returns how
    /// many messages moved. A malformed message is logged and dropped
    /// (its slot and page slot are still consumed, so the stream stays in step).
    pub fn drain(&self) -> usize {
        self.flush();
        let Some(mut rx) = self.received.try_lock() else {
            return 0; // another thread is draining
        };
        let me = self.t.node();
        let r = self.t.region();
        let mut moved = 0;
        for src in 0..self.layout.nodes {
            if src == me {
                continue;
            }
            let Received {
                consumed: got,
                credited,
            } = &mut rx[src as usize];
            loop {
                let off = self.layout.ring_off(src, got.msgs);
                // Acquire (Region::load) on the word holding the flag: pairs with the Release
                // of the write's last word, so the whole message (and the page written
                // before it on the same ordered connection) is visible.
                if (r.load(off + 56) >> 56) as u8 != FULL {
                    break;
                }
                let mut b = [0u8; MSG_BYTES];
                if r.read(off, &mut b).is_err() {
                    break; // cannot happen: the layout keeps slots inside the region
                }
                r.store(off + 56, 0); // free the slot (the sender will not reuse it before credit)
                let seq = got.msgs;
                got.msgs += 1;
                // Release: a reader of `next` that then loads the new slot's flag (Acquire)
                // looks past a freed slot, never at it
                self.next[src as usize].store(got.msgs, Ordering::Release);
                match Envelope::from_bytes(&b, self.layout.nodes) {
                    Ok(env) => {
                        let page = if env.from_worker & HAS_PAGE != 0 {
                            let mut p = Box::new([0u8; PAGE_BYTES]);
                            let ok = r.read(self.layout.page_off(src, got.pages), &mut p[..]);
                            got.pages += 1;
                            ok.ok().map(|_| p)
                        } else {
                            None
                        };
                        if env.from_node != src || env.seq != seq as u32 {
                            log::error!(
                                "channel from node {src}: message {seq} claims node {} seq {}: dropped",
                                env.from_node,
                                env.seq
                            );
                            continue;
                        }
                        self.queue(Incoming { env, page });
                        moved += 1;
                    }
                    Err(e) => log::error!("channel from node {src}: malformed message: {e}"),
                }
            }
            // Credit goes back once half a ring (of messages or of pages) was consumed since
            // the last time, not after every drain: over tcp each return is a system call and
            // a packet. A sender that waits for credit has a full ring (or page ring) in
            // flight, so the drain that consumes it returns credit.
            let (ring, pages) = (self.layout.ring as u64, self.layout.pages as u64);
            if got.msgs - credited.msgs >= ring.div_ceil(2)
                || got.pages - credited.pages >= pages.div_ceil(2)
            {
                let mut credit = [0u8; 16];
                credit[..8].copy_from_slice(&got.msgs.to_le_bytes());
                credit[8..].copy_from_slice(&got.pages.to_le_bytes());
                if let Err(e) = self.t.write(src, self.layout.credit_off(me), &credit) {
                    log::debug!("returning credit to node {src}: {e}");
                }
                *credited = *got;
            }
        }
        drop(rx);
        if moved > 0 {
            self.t.region().wake_unless_helped(0);
        }
        moved
    }

    /// Put `m` at the end of the inbox.
    fn queue(&self, m: Incoming) {
        let mut inbox = self.inbox.lock();
        inbox.push_back(m);
        // Release: after the push, under the lock (a reader that sees the count and then takes
        // the lock finds the message)
        self.queued.store(inbox.len(), Ordering::Release);
    }

    /// The first message of the inbox, if any.
    fn unqueue(&self) -> Option<Incoming> {
        let mut inbox = self.inbox.lock();
        let m = inbox.pop_front();
        self.queued.store(inbox.len(), Ordering::Release);
        m
    }

    /// The next received message, if any (flushes the backlogs first, and drains the rings
    /// when the inbox is empty).
    pub fn try_recv(&self) -> Option<Incoming> {
        self.flush();
        if let Some(m) = self.unqueue() {
            return Some(m);
        }
        self.drain();
        self.unqueue()
    }

    /// Whether a message may be ready: the inbox is not empty, or a ring has a complete
    /// message at the position it is consumed from. A racy snapshot, without a lock: one
    /// load for the inbox and two per source. It may miss a message that a drain running on
    /// another thread is moving into the inbox right now; that drain then wakes the handler
    /// (or the helpers polling see the message in the inbox on their next look), as after
    /// any drain that moved something. Also true while a backlog's first message has room
    /// now (returned credit lands like a message: whoever looks flushes it).
    pub fn pending(&self) -> bool {
        let r = self.t.region();
        let l = &self.layout;
        let me = self.t.node();
        self.queued.load(Ordering::Acquire) > 0
            || (0..l.nodes).any(|s| {
                s != me && {
                    let next = self.next[s as usize].load(Ordering::Acquire);
                    (r.load(l.ring_off(s, next) + 56) >> 56) as u8 == FULL
                }
            })
            || (self.backlogged() > 0 && self.backlog_may_leave())
    }

    /// Whether some backlog's first message has room now (a peer whose stream is locked
    /// right now counts: its holder writes).
    fn backlog_may_leave(&self) -> bool {
        (0..self.layout.nodes).any(|peer| match self.sent[peer as usize].try_lock() {
            None => true,
            Some(o) => o
                .backlog
                .front()
                .is_some_and(|w| self.room(peer, &o.sent, w.page.is_some()).unwrap_or(true)),
        })
    }

    /// Wait until a message may be ready, `timeout` passed or `stop` is set. Only one thread
    /// (the node's handler) may wait.
    pub fn wait(&self, timeout: Duration, stop: &AtomicBool) {
        let deadline = Instant::now() + timeout;
        let r = self.t.region();
        // while threads waiting for answers poll the rings themselves, spinning here only
        // takes the core from them: park at once (writers do not wake us meanwhile; the last
        // helper looks once more when it leaves, see `Region::stop_helping`)
        let spins = if r.helpers() > 0 {
            0
        } else {
            crate::wait::SPINS
        };
        r.queue(0).wait_spinning(
            spins,
            self.mode,
            Some(deadline),
            || self.pending(),
            || stop.load(Ordering::Acquire),
        );
    }

    /// Wake the thread in [`Channels::wait`] (e.g. to notice `stop`, or new local work).
    pub fn wake(&self) {
        self.t.region().queue(0).wake();
    }

    /// This thread polls the channels for answers until the guard is dropped (see
    /// [`crate::Region::helpers`]).
    pub fn helping(&self) -> Helping<'_> {
        self.t.helping(true);
        Helping { ch: self }
    }
}

/// A thread polling for answers on behalf of the regions its transport can serve; dropping it
/// ends that (see [`Channels::helping`]).
#[must_use]
pub struct Helping<'a> {
    ch: &'a Channels,
}

impl Drop for Helping<'_> {
    fn drop(&mut self) {
        self.ch.t.helping(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::BODY_BYTES;
    use crate::transport::mem_cluster;

    fn env(n: u8) -> Envelope {
        let mut body = [0u8; BODY_BYTES];
        body[0] = n;
        Envelope {
            kind: 9,
            from_node: 0,
            from_worker: 0,
            seq: 0,
            body,
        }
    }

    fn pair(l: ChannelLayout) -> (Channels, Channels) {
        let ts = mem_cluster(vec![l.region().unwrap(), l.region().unwrap()]).unwrap();
        let mut it = ts.into_iter();
        let a = it.next().unwrap();
        let b = it.next().unwrap();
        (
            Channels::new(a, l, WaitMode::Park).unwrap(),
            Channels::new(b, l, WaitMode::Park).unwrap(),
        )
    }

    #[test]
    fn messages_and_pages_arrive_in_order_across_ring_wraps() {
        let l = ChannelLayout {
            nodes: 2,
            ring: 4,
            pages: 2,
        };
        let (a, b) = pair(l);
        let b = Arc::new(b);
        let rx = Arc::clone(&b);
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            let stop = AtomicBool::new(false);
            while got.len() < 200 {
                match rx.try_recv() {
                    Some(m) => got.push((m.env.body[0], m.page.map(|p| p[4095]))),
                    None => rx.wait(Duration::from_millis(5), &stop),
                }
            }
            got
        });
        for i in 0..200u32 {
            let page = [(i % 251) as u8; PAGE_BYTES];
            let with = i % 3 == 0;
            a.send(1, env(i as u8), with.then_some(&page)).unwrap();
        }
        // what had no room waits in the backlog; the sender's node keeps flushing it (its
        // handler does, in every round)
        while a.backlogged() > 0 {
            a.flush();
            std::thread::yield_now();
        }
        let got = reader.join().unwrap();
        for (i, (n, p)) in got.into_iter().enumerate() {
            assert_eq!(n, i as u8, "message order");
            assert_eq!(
                p,
                (i % 3 == 0).then_some((i % 251) as u8),
                "page of message {i}"
            );
        }
    }

    #[test]
    fn pending_sees_each_message_in_the_ring_and_the_inbox_until_it_is_taken() {
        let l = ChannelLayout {
            nodes: 2,
            ring: 3,
            pages: 1,
        };
        let (a, b) = pair(l);
        assert!(!b.pending(), "nothing sent yet");
        // across two ring wraps: each message is pending in the ring, then in the inbox (after
        // a drain), and nothing is once it was taken
        for i in 0..7u8 {
            a.send(1, env(i), None).unwrap();
            assert!(b.pending(), "message {i} in the ring");
            assert_eq!(b.drain(), 1);
            assert!(b.pending(), "message {i} in the inbox");
            assert_eq!(b.try_recv().map(|m| m.env.body[0]), Some(i));
            assert!(!b.pending(), "message {i} taken");
        }
        // a message to oneself goes straight to the inbox
        b.send(1, env(9), None).unwrap();
        assert!(b.pending());
        assert_eq!(b.try_recv().map(|m| m.env.body[0]), Some(9));
        assert!(!b.pending() && !a.pending());
    }

    #[test]
    fn credit_goes_back_once_half_a_ring_was_consumed() {
        let l = ChannelLayout {
            nodes: 2,
            ring: 8,
            pages: 4,
        };
        let (a, b) = pair(l);
        let page = [7u8; PAGE_BYTES];
        for i in 0..3u8 {
            a.send(1, env(i), None).unwrap();
        }
        assert_eq!(b.drain(), 3);
        assert_eq!(a.credit(1), (0, 0), "3 of 8 messages: no credit yet");
        a.send(1, env(3), None).unwrap();
        assert_eq!(b.drain(), 1);
        assert_eq!(a.credit(1), (4, 0), "half the ring");
        // two pages are half the page ring
        a.send(1, env(4), Some(&page)).unwrap();
        assert_eq!(b.drain(), 1);
        assert_eq!(a.credit(1), (4, 0));
        a.send(1, env(5), Some(&page)).unwrap();
        assert_eq!(b.drain(), 1);
        assert_eq!(a.credit(1), (6, 2), "half the page ring");
        // with the ring full, a send does not wait: its message waits in the backlog, and
        // leaves with the credit of the drain that empties the ring
        for i in 0..9u8 {
            a.send(1, env(i), None).unwrap();
        }
        assert_eq!(a.backlogged(), 1, "8 in flight, the ninth waits");
        assert!(!a.pending(), "no room yet: nothing for node 0 to do");
        assert_eq!(b.drain(), 8);
        assert!(a.pending(), "the credit came back: the backlog may leave");
        a.flush();
        assert_eq!(a.backlogged(), 0);
        assert_eq!(b.drain(), 1);
        let (a, b) = (Arc::new(a), Arc::new(b));
        let rx = Arc::clone(&b);
        let reader = std::thread::spawn(move || {
            let stop = AtomicBool::new(false);
            let mut n = 0;
            while n < 100 {
                match rx.try_recv() {
                    Some(_) => n += 1,
                    None => rx.wait(Duration::from_millis(5), &stop),
                }
            }
        });
        for i in 0..94u8 {
            a.send(1, env(i), (i % 5 == 0).then_some(&page)).unwrap();
        }
        while a.backlogged() > 0 {
            a.flush();
            std::thread::yield_now();
        }
        reader.join().unwrap();
    }

    #[test]
    fn full_rings_in_both_directions_do_not_deadlock() {
        let l = ChannelLayout {
            nodes: 2,
            ring: 2,
            pages: 1,
        };
        let (a, b) = pair(l);
        let (a, b) = (Arc::new(a), Arc::new(b));
        // both nodes only send (nobody calls try_recv until the end): sends never wait, what
        // has no room waits in the backlog. Each node keeps draining (as a node's handler
        // always does, which also flushes its backlog) until both backlogs left.
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let h: Vec<_> = [(Arc::clone(&a), 1u8), (Arc::clone(&b), 0u8)]
            .into_iter()
            .map(|(c, to)| {
                let done = Arc::clone(&done);
                std::thread::spawn(move || {
                    for i in 0..100u8 {
                        c.send(to, env(i), Some(&[i; PAGE_BYTES])).unwrap();
                    }
                    while c.backlogged() > 0 {
                        c.drain();
                        std::thread::yield_now();
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                    while done.load(Ordering::SeqCst) < 2 {
                        c.drain();
                        std::thread::yield_now();
                    }
                })
            })
            .collect();
        for t in h {
            t.join().unwrap();
        }
        let count = |c: &Channels| std::iter::from_fn(|| c.try_recv()).count();
        assert_eq!(count(&a), 100);
        assert_eq!(count(&b), 100);
    }

    /// A peer that takes no message for the credit timeout is given up on: the flush or send
    /// that finds the backlog's first message waited that long fails and severs the link, so
    /// later sends fail at once as to a dead node (a lost message would otherwise leave the
    /// two nodes disagreeing for good).
    #[test]
    fn a_peer_that_takes_nothing_for_the_credit_timeout_is_severed() {
        let l = ChannelLayout {
            nodes: 2,
            ring: 2,
            pages: 1,
        };
        let (mut a, _b) = pair(l);
        a.credit_timeout = Duration::from_millis(50);
        a.send(1, env(0), None).unwrap();
        a.send(1, env(1), None).unwrap();
        assert!(a.peer_alive(1));
        // node 1 never drains: its ring of 2 is full, the third message waits
        a.send(1, env(2), None).unwrap();
        assert_eq!(a.backlogged(), 1);
        a.flush();
        assert!(a.peer_alive(1), "not before the credit timeout");
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(
            a.send(1, env(3), None),
            Err(MsgError::Timeout { peer: 1, ms: 50 })
        );
        assert!(!a.peer_alive(1), "severed");
        assert_eq!(
            a.backlogged(),
            0,
            "the lost messages are gone with the link"
        );
        assert_eq!(a.send(1, env(4), None), Err(MsgError::PeerDead(1)));
    }

    #[test]
    fn sending_to_self_and_to_a_dead_peer() {
        let l = ChannelLayout::new(2);
        let regions = vec![l.region().unwrap(), l.region().unwrap()];
        let ts = mem_cluster(regions).unwrap();
        let killer = Arc::clone(&ts[0]);
        let a = Channels::new(ts[0].clone(), l, WaitMode::Park).unwrap();
        a.send(0, env(7), None).unwrap();
        let m = a.try_recv().unwrap();
        assert_eq!((m.env.body[0], m.env.from_node), (7, 0));
        killer.kill(1);
        assert_eq!(a.send(1, env(1), None), Err(MsgError::PeerDead(1)));
        assert!(matches!(
            a.send(2, env(1), None),
            Err(MsgError::NoSuchPeer(2, 2))
        ));
    }

    #[test]
    fn a_forged_message_is_dropped_and_the_stream_continues() {
        let l = ChannelLayout::new(2);
        let (a, b) = pair(l);
        // node 0 writes a message into its ring slot at node 1 claiming to come from node 1
        let mut bad = env(1);
        bad.from_node = 1;
        a.t.write(1, l.ring_off(0, 0), &bad.to_bytes()).unwrap();
        // and garbage (kind 0) into the next slot
        let mut junk = [0u8; MSG_BYTES];
        junk[63] = FULL;
        a.t.write(1, l.ring_off(0, 1), &junk).unwrap();
        // the real stream resumes at position 2
        a.sent[1].lock().sent.msgs = 2;
        a.send(1, env(5), None).unwrap();
        let got: Vec<u8> = std::iter::from_fn(|| b.try_recv())
            .map(|m| m.env.body[0])
            .collect();
        assert_eq!(got, vec![5]);
    }
}
