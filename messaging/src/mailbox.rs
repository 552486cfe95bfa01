//! Mailboxes: request/response messaging over one-sided writes.
//!
//! Region layout of every node (see [`Layout`]):
//!
//! ```text
//! request slots    nodes x workers x 64 B   slot (p, w): requests from worker w of node p
//! response slots   workers x nodes x 64 B   slot (w, p): replies from node p to our worker w
//! (padding to 4 KiB)
//! page frames      frames x 4 KiB           pages pushed to us by peers
//! ```
//!
//! A worker sends a request by writing it into its slot at the peer, then waits on its own
//! response slot. The peer's handler that owns the request slot (slot index modulo the number
//! of handlers) reads it, clears it, and writes the reply into the worker's response slot; a
//! page, if any, is pushed into the named frame first, on the same ordered connection, so it is
//! complete when the reply's flag is seen. The last byte of each slot is the flag, written last
//! (see [`crate::region`]). One request is outstanding per (worker, peer) slot at a time; a
//! reply carries its request's sequence number, so a late reply to a timed-out request is
//! recognised and dropped.

use crate::error::MsgError;
use crate::message::{Envelope, MSG_BYTES};
use crate::region::{Region, NO_QUEUE, SLOT_BYTES};
use crate::transport::Transport;
use crate::wait::WaitMode;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of a page frame.
pub const PAGE_BYTES: usize = 4096;

/// Shape of every node's region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub nodes: u8,
    pub workers: u16,
    pub handlers: u16,
    pub frames: u32,
}

impl Layout {
    pub fn validate(&self) -> Result<(), MsgError> {
        if self.nodes == 0 || self.nodes > 64 {
            return Err(MsgError::Config(format!(
                "a cluster has 1 to 64 nodes, got {}",
                self.nodes
            )));
        }
        if self.workers == 0 || self.handlers == 0 {
            return Err(MsgError::Config(
                "need at least one worker and one handler".into(),
            ));
        }
        Ok(())
    }
    fn request_slot(&self, from_node: u8, worker: u16) -> usize {
        from_node as usize * self.workers as usize + worker as usize
    }
    fn response_slot(&self, worker: u16, peer: u8) -> usize {
        self.nodes as usize * self.workers as usize
            + worker as usize * self.nodes as usize
            + peer as usize
    }
    fn slots(&self) -> usize {
        2 * self.nodes as usize * self.workers as usize
    }
    fn frames_offset(&self) -> usize {
        (self.slots() * SLOT_BYTES).div_ceil(PAGE_BYTES) * PAGE_BYTES
    }
    /// Byte offset of page frame `f`.
    pub fn frame_offset(&self, f: u32) -> usize {
        self.frames_offset() + f as usize * PAGE_BYTES
    }
    /// Bytes of the region.
    pub fn region_bytes(&self) -> usize {
        self.frame_offset(self.frames)
    }
    fn handler_of(&self, request_slot: usize) -> u16 {
        (request_slot % self.handlers as usize) as u16
    }
    /// A zeroed region of this layout: request slots wake their handler, response slots their
    /// worker.
    pub fn region(&self) -> Result<Region, MsgError> {
        self.validate()?;
        let nw = self.nodes as usize * self.workers as usize;
        let mut slot_queue = vec![NO_QUEUE; self.slots()];
        for (i, q) in slot_queue.iter_mut().enumerate() {
            *q = if i < nw {
                self.handler_of(i) as u32
            } else {
                self.handlers as u32 + ((i - nw) / self.nodes as usize) as u32
            };
        }
        Region::new(
            self.region_bytes(),
            slot_queue,
            self.handlers as usize + self.workers as usize,
        )
    }
}

/// What a handler gets besides the request: a way to push pages to the requester, which land
/// before the reply (same ordered connection).
pub struct Responder<'a, T: Transport> {
    mb: &'a Mailboxes<T>,
    to_node: u8,
}

impl<T: Transport> Responder<'_, T> {
    /// Write `page` into the requester's frame `frame`.
    pub fn push_page(&mut self, frame: u32, page: &[u8; PAGE_BYTES]) -> Result<(), MsgError> {
        let l = &self.mb.layout;
        if frame >= l.frames {
            return Err(MsgError::Decode(format!(
                "page push into frame {frame} >= {}",
                l.frames
            )));
        }
        self.mb.t.write(self.to_node, l.frame_offset(frame), page)
    }
}

/// One node's mailboxes over a transport.
pub struct Mailboxes<T: Transport> {
    t: Arc<T>,
    layout: Layout,
    mode: WaitMode,
    /// Per (worker, peer): sequence number of the last request sent.
    seq: Box<[AtomicU32]>,
    /// Per (worker, peer): sequence number of a request still unanswered (0 = none).
    pending: Box<[AtomicU32]>,
}

impl<T: Transport> Mailboxes<T> {
    pub fn new(t: Arc<T>, layout: Layout, mode: WaitMode) -> Result<Self, MsgError> {
        layout.validate()?;
        if t.nodes() != layout.nodes || t.region().len() < layout.region_bytes() {
            return Err(MsgError::Config(
                "the transport's cluster or region does not match the mailbox layout".into(),
            ));
        }
        let n = layout.workers as usize * layout.nodes as usize;
        Ok(Mailboxes {
            t,
            layout,
            mode,
            seq: (0..n).map(|_| AtomicU32::new(0)).collect(),
            pending: (0..n).map(|_| AtomicU32::new(0)).collect(),
        })
    }

    pub fn transport(&self) -> &Arc<T> {
        &self.t
    }
    pub fn layout(&self) -> Layout {
        self.layout
    }

    fn take_reply(&self, off: usize) -> Option<[u8; MSG_BYTES]> {
        let r = self.t.region();
        if (r.load(off + 56) >> 56) as u8 != crate::message::FULL {
            return None;
        }
        let mut b = [0u8; MSG_BYTES];
        r.read(off, &mut b).ok()?;
        r.store(off + 56, 0); // free the slot
        Some(b)
    }

    /// Send `msg` from `worker` to `peer` and wait for the reply (at most `timeout`).
    /// `worker` must be used by one thread at a time.
    pub fn call(
        &self,
        worker: u16,
        peer: u8,
        msg: &impl crate::message::Message,
        timeout: Duration,
    ) -> Result<Envelope, MsgError> {
        let l = &self.layout;
        if peer >= l.nodes {
            return Err(MsgError::NoSuchPeer(peer, l.nodes));
        }
        if worker >= l.workers {
            return Err(MsgError::Config(format!(
                "worker {worker} >= {}",
                l.workers
            )));
        }
        let idx = worker as usize * l.nodes as usize + peer as usize;
        let resp = l.response_slot(worker, peer) * SLOT_BYTES;
        let deadline = Instant::now() + timeout;
        // A previous call timed out: its reply may still come and its request may still sit in
        // the peer's slot. Wait for it (dropping it) before reusing the slot.
        if self.pending[idx].load(Ordering::Relaxed) != 0 {
            self.await_seq(worker, peer, idx, resp, deadline)?;
        }
        let seq = self.seq[idx]
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1)
            .max(1);
        let env = Envelope {
            seq,
            from_node: self.t.node(),
            from_worker: worker,
            ..Envelope::new(msg, 0, 0, 0)
        };
        self.pending[idx].store(seq, Ordering::Relaxed);
        let req = l.request_slot(self.t.node(), worker) * SLOT_BYTES;
        self.t.write(peer, req, &env.to_bytes())?;
        self.await_seq(worker, peer, idx, resp, deadline)
    }

    fn await_seq(
        &self,
        worker: u16,
        peer: u8,
        idx: usize,
        resp: usize,
        deadline: Instant,
    ) -> Result<Envelope, MsgError> {
        let want = self.pending[idx].load(Ordering::Relaxed);
        let q = self
            .t
            .region()
            .queue(self.layout.handlers as u32 + worker as u32);
        loop {
            let mut got = None;
            let ok = q.wait(
                self.mode,
                Some(deadline),
                || {
                    got = self.take_reply(resp);
                    got.is_some()
                },
                || !self.t.peer_alive(peer),
            );
            if !ok {
                if !self.t.peer_alive(peer) {
                    return Err(MsgError::PeerDead(peer));
                }
                return Err(MsgError::Timeout {
                    peer,
                    ms: deadline
                        .saturating_duration_since(Instant::now())
                        .as_millis() as u64,
                });
            }
            let b = got.expect("ready implies a reply");
            let env = Envelope::from_bytes(&b, self.layout.nodes)?;
            if env.seq == want {
                self.pending[idx].store(0, Ordering::Relaxed);
                return Ok(env);
            }
            log::debug!(
                "dropping a late reply (seq {}, waiting for {want})",
                env.seq
            );
        }
    }

    /// Serve the requests of handler `handler` that are waiting now. Returns how many.
    pub fn serve_ready(
        &self,
        handler: u16,
        f: &mut impl FnMut(&Envelope, &mut Responder<'_, T>) -> Envelope,
    ) -> usize {
        let l = &self.layout;
        let mut served = 0;
        let nw = l.nodes as usize * l.workers as usize;
        let mut slot = handler as usize;
        while slot < nw {
            let off = slot * SLOT_BYTES;
            if let Some(b) = self.take_reply(off) {
                served += 1;
                let from_node = (slot / l.workers as usize) as u8;
                let from_worker = (slot % l.workers as usize) as u16;
                match Envelope::from_bytes(&b, l.nodes) {
                    Ok(env) if env.from_node == from_node && env.from_worker == from_worker => {
                        let mut responder = Responder {
                            mb: self,
                            to_node: from_node,
                        };
                        let mut out = f(&env, &mut responder);
                        // the requester waits on its slot for replies from us
                        let resp = l.response_slot(from_worker, self.t.node()) * SLOT_BYTES;
                        out.seq = env.seq;
                        out.from_node = self.t.node();
                        out.from_worker = handler;
                        if let Err(e) = self.t.write(from_node, resp, &out.to_bytes()) {
                            log::warn!("reply to node {from_node} worker {from_worker}: {e}");
                        }
                    }
                    Ok(env) => log::error!(
                        "request in slot of node {from_node} worker {from_worker} claims to be from node {} worker {}: dropped",
                        env.from_node,
                        env.from_worker
                    ),
                    Err(e) => log::error!("malformed request from node {from_node}: {e}"),
                }
            }
            slot += l.handlers as usize;
        }
        served
    }

    /// Run handler `handler` until `stop` is set: serve requests, park when idle.
    pub fn run_handler(
        &self,
        handler: u16,
        stop: &AtomicBool,
        mut f: impl FnMut(&Envelope, &mut Responder<'_, T>) -> Envelope,
    ) {
        let q = self.t.region().queue(handler as u32);
        while !stop.load(Ordering::Acquire) {
            if self.serve_ready(handler, &mut f) > 0 {
                continue;
            }
            let l = &self.layout;
            let r = self.t.region();
            let nw = l.nodes as usize * l.workers as usize;
            q.wait(
                self.mode,
                Some(Instant::now() + Duration::from_millis(50)),
                || {
                    (handler as usize..nw)
                        .step_by(l.handlers as usize)
                        .any(|s| (r.load(s * SLOT_BYTES + 56) >> 56) as u8 == crate::message::FULL)
                },
                || stop.load(Ordering::Acquire),
            );
        }
    }

    /// Copy page frame `f` of the local region out.
    pub fn read_frame(&self, f: u32, out: &mut [u8; PAGE_BYTES]) -> Result<(), MsgError> {
        if f >= self.layout.frames {
            return Err(MsgError::Config(format!(
                "frame {f} >= {}",
                self.layout.frames
            )));
        }
        self.t.region().read(self.layout.frame_offset(f), out)
    }

    /// Wake this node's handlers (e.g. to notice `stop`).
    pub fn wake_handlers(&self) {
        for h in 0..self.layout.handlers {
            self.t.region().queue(h as u32).wake();
        }
    }
}
