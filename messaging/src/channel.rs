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
//! **Sending** (node `s` to `d`, under `s`'s lock for `d`): wait for credit, write the page (if
//! any) into the next slot of `d`'s page ring for `s`, then the message into the next slot of
//! `d`'s message ring for `s`. Writes to one peer are applied in order, so the page is complete
//! when the message's flag (its last byte, written last) is seen; both go in one
//! [`Transport::write_two`] (over tcp, one system call). A message's `from_worker`
//! field carries the channel's flags (bit 0: a page is attached), its `seq` the message's
//! position in the stream, which the receiver checks.
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
    /// Per peer: what we sent it.
    sent: Box<[Mutex<Sent>]>,
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
            sent: (0..n).map(|_| Mutex::new(Sent::default())).collect(),
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
    /// to `peer`. Waits while `peer`'s ring for us is full, draining our own rings meanwhile.
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
        let mut s = self.sent[peer as usize].lock();
        let mut deadline = None;
        loop {
            let (msgs, pages) = self.credit(peer);
            if msgs > s.msgs || pages > s.pages {
                // the peer says it consumed more than we sent: its credit slot is corrupt, and
                // nothing it says about the stream can be trusted any more
                log::error!(
                    "node {me}: node {peer} returned credit for {msgs} messages and {pages} \
                     pages, {} and {} were sent: giving up on it",
                    s.msgs,
                    s.pages
                );
                self.t.sever(peer);
                return Err(MsgError::Decode(format!(
                    "node {peer}'s credit runs ahead of what was sent"
                )));
            }
            let room = s.msgs - msgs < self.layout.ring as u64
                && (page.is_none() || s.pages - pages < self.layout.pages as u64);
            if room {
                break;
            }
            if !self.t.peer_alive(peer) {
                return Err(MsgError::PeerDead(peer));
            }
            let d = *deadline.get_or_insert_with(|| Instant::now() + self.credit_timeout);
            if Instant::now() >= d {
                // The message is lost to a peer that looks alive: the protocols above assume
                // every message arrives, so the link goes (both ends then see a dead node).
                log::error!(
                    "node {me}: node {peer} took no message for {} ms: giving up on it",
                    self.credit_timeout.as_millis()
                );
                self.t.sever(peer);
                return Err(MsgError::Timeout {
                    peer,
                    ms: self.credit_timeout.as_millis() as u64,
                });
            }
            // keep our own inbound streams moving: the peer may be waiting for credit from us
            self.drain();
            std::thread::yield_now();
        }
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

    /// Send a typed message (see [`Channels::send`]): the channel fills in the header.
    pub fn send_msg<M: Message>(
        &self,
        peer: u8,
        m: &M,
        page: Option<&[u8; PAGE_BYTES]>,
    ) -> Result<(), MsgError> {
        self.send(peer, Envelope::of(m), page)
    }

    /// Move every complete message from the rings into the inbox and return credit to the
    /// senders. Returns how many messages moved. A malformed message is logged and dropped
    /// (its slot and page slot are still consumed, so the stream stays in step).
    pub fn drain(&self) -> usize {
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

    /// The next received message, if any (drains the rings first when the inbox is empty).
    pub fn try_recv(&self) -> Option<Incoming> {
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
    /// any drain that moved something.
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
        // a sender never waits for good: with the ring full it gets credit from the drain
        // that empties it
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
        // both nodes only send (nobody calls try_recv until the end): senders drain while
        // they wait for credit, so both finish. A node that finished keeps draining (as a
        // node's handler always does) until the other one finished too.
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let h: Vec<_> = [(Arc::clone(&a), 1u8), (Arc::clone(&b), 0u8)]
            .into_iter()
            .map(|(c, to)| {
                let done = Arc::clone(&done);
                std::thread::spawn(move || {
                    for i in 0..100u8 {
                        c.send(to, env(i), Some(&[i; PAGE_BYTES])).unwrap();
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

    /// A peer that takes no message for the credit timeout is given up on: the send fails
    /// and the link is severed, so later sends fail at once as to a dead node (a lost message
    /// would otherwise leave the two nodes disagreeing for good).
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
        // node 1 never drains: its ring of 2 is full
        assert_eq!(
            a.send(1, env(2), None),
            Err(MsgError::Timeout { peer: 1, ms: 50 })
        );
        assert!(!a.peer_alive(1), "severed");
        assert_eq!(a.send(1, env(3), None), Err(MsgError::PeerDead(1)));
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
        a.sent[1].lock().msgs = 2;
        a.send(1, env(5), None).unwrap();
        let got: Vec<u8> = std::iter::from_fn(|| b.try_recv())
            .map(|m| m.env.body[0])
            .collect();
        assert_eq!(got, vec![5]);
    }
}
