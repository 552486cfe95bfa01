//! Sending: protocol and control messages, and batches of small messages per destination.
//!
//! Nothing is sent to a node but through [`Coherence::send`] and [`Coherence::try_send_control`],
//! which first flush that node's outbox: that is what keeps each connection's order (see
//! [`super::outbox`]).

use super::outbox::{Queued, Unsent};
use super::protocol::{Msg, Node};
use super::wire::{batchable, encode_batch, Control, Wire};
use super::{possession_of, Coherence};
use crate::buffer::Buffer;
use crate::error::EngineError;
use crate::pid::Pid;
use shoal_messaging::{MsgError, PAGE_BYTES};
use std::sync::atomic::Ordering;

impl Coherence {
    /// Send a protocol message about `pid` (with the page bytes, if it carries a page).
    pub(super) fn send<D: Clone>(
        &self,
        to: Node,
        pid: Pid,
        msg: &Msg<D>,
        page: Option<&[u8; PAGE_BYTES]>,
    ) -> Result<(), EngineError> {
        debug_assert!(
            to == self.me || super::msg_has_page(msg) == page.is_some(),
            "{} to node {to}: the page travels exactly when the message carries one",
            msg.name()
        );
        let w = Wire::new(pid.raw(), msg);
        if to != self.me && batchable(&w.msg) {
            // travels in the next batch to `to` (see outbox.rs for why order is kept)
            let r = self
                .driver
                .outbox
                .push(to, w.pid, w.msg, |to, m| self.send_batch(to, m));
            return r.map_err(|u| self.unsent(u));
        }
        let r = self.flush_to(to).and_then(|()| {
            if to != self.me {
                self.driver
                    .counters
                    .messages
                    .fetch_add(1, Ordering::Relaxed);
                if page.is_some() {
                    self.driver.counters.pages.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.driver
                .ch
                .send_msg(to, &w, page)
                .map_err(|e| send_error(to, msg.name(), e))
        });
        // Noted whatever happened, a failure to send `to`'s queued batch first included: the
        // caller has given up its copy either way, and if `to` is dead, this node's records
        // are the page's only durable state (the page may also have left: harmless).
        self.note_handed(to, pid, msg);
        r
    }

    /// Send `to`'s queued batch, if any (before anything else goes to `to`).
    fn flush_to(&self, to: Node) -> Result<(), EngineError> {
        if to == self.me {
            return Ok(());
        }
        self.driver
            .outbox
            .flush_if_queued(to, |to, m| self.send_batch(to, m))
            .map_err(|u| self.unsent(u))
    }

    /// Send every queued batch (the provider after an eviction pass, the handler after a round
    /// of messages). Failures are logged and handled as in [`Coherence::unsent`].
    pub fn flush_batches(&self) {
        for u in self.driver.outbox.flush(|to, m| self.send_batch(to, m)) {
            let e = self.unsent(u);
            log::warn!("node {}: {e}", self.me);
        }
    }

    fn send_batch(&self, to: Node, msgs: &[Queued]) -> Result<(), EngineError> {
        let page = encode_batch(msgs);
        self.driver
            .counters
            .messages
            .fetch_add(1, Ordering::Relaxed);
        self.driver.counters.batches.fetch_add(1, Ordering::Relaxed);
        let c = Control::Batch {
            count: msgs.len() as u16,
        };
        self.driver
            .ch
            .send_msg(to, &c, Some(&page))
            .map_err(|e| send_error(to, "a batch", e))
    }

    /// A batch did not leave: the eviction notices in it never reached the home, so their
    /// copies must become idle again (done by the handler: the caller may hold a shard lock).
    /// Lost replies need nothing: the node they were for is unreachable.
    fn unsent(&self, u: Unsent) -> EngineError {
        log::debug!(
            "node {}: a batch of {} message(s) to node {} did not leave: {}",
            self.me,
            u.msgs.len(),
            u.to,
            u.error
        );
        let pids = u
            .msgs
            .iter()
            .filter(|(_, m)| matches!(m, Msg::Evict { .. }))
            .map(|&(pid, _)| Pid(pid));
        self.driver.unsent.lock().extend(pids);
        self.driver.ch.wake();
        u.error
    }

    /// The handler's part of [`Coherence::unsent`]: a copy still waiting for the reply to a
    /// notice that never left is idle again (and keeps its page).
    pub(super) fn restore_unsent(&self, buf: &Buffer) {
        let pids = std::mem::take(&mut *self.driver.unsent.lock());
        for pid in pids {
            let mut shard = self.pages.shard(pid).lock();
            let Some(ps) = shard.get_mut(&pid) else {
                continue;
            };
            if ps.copy.pending != super::possession::Pending::Evicting {
                continue;
            }
            let Some(idx) = ps.copy.data else { continue };
            let Some(h) = buf.try_hold(idx, pid) else {
                if buf.frame(idx).pid() == pid {
                    // a guard waits on it (possession none): try again next round
                    self.driver.unsent.lock().push(pid);
                }
                continue;
            };
            if let Err(e) = ps.copy.evict_unsent() {
                log::error!("node {}: {pid}: {e}", self.me);
            }
            // what arrived meanwhile (a successor's Transfer: the home still lists this node)
            // is served by the handler's next `progress`, under the latch
            ps.serve_due |= !ps.copy.deferred.is_empty();
            h.frame().set_possession(possession_of(&ps.copy));
            // as if just used: the provider tries other pages before this one again (else a
            // cache full of such copies is picked again and again while nothing is freed)
            h.frame().touch(buf.clock());
            drop(h);
            Self::wake(ps);
            self.pages.retry_later(pid);
        }
    }

    /// Send a control message; a failure is logged (for answers whose loss the peer survives:
    /// it is dead, or it times out).
    pub(super) fn send_control(&self, to: Node, c: &Control) {
        if let Err(e) = self.try_send_control(to, c) {
            log::warn!("node {}: {e}", self.me);
        }
    }

    pub(super) fn try_send_control(&self, to: Node, c: &Control) -> Result<(), EngineError> {
        self.flush_to(to)?;
        self.driver
            .ch
            .send_msg(to, c, None)
            .map_err(|e| send_error(to, &format!("{c:?}"), e))
    }
}

/// A channel's send error as the engine reports it.
fn send_error(to: Node, what: &str, e: MsgError) -> EngineError {
    match e {
        MsgError::PeerDead(n) => EngineError::PeerDead { node: n },
        e => EngineError::SendFailed {
            to,
            what: what.to_string(),
            why: e.to_string(),
        },
    }
}
