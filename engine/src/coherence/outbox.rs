//! Outboxes: small coherence messages to one node, gathered and sent as one
//! [`Control::Batch`](crate::coherence::wire::Control::Batch).
//!
//! Eviction notices without a page (from the provider) and eviction replies (from the home's
//! handler) are queued here instead of being sent one by one; a batch leaves when
//! - its sender says so: the provider after each eviction pass, the handler after each round
//!   of incoming messages ([`Outboxes::flush`]);
//! - it is full ([`BATCH_MAX`] messages);
//! - anything else is about to be sent to the same node: every send flushes the destination's
//!   outbox first ([`Outboxes::flush_if_queued`]).
//!
//! The last rule is what keeps the transports' order. The engine delivers a node's messages
//! to another node in the order it sent them (per-connection FIFO); the model check does not
//! even need that (it delivers in-flight messages in any order), but the handler's held queue
//! and the documentation of each race are written for FIFO, and batching must not break it. A queued
//! message counts as sent when it is queued, under its page's slot lock, with the page's
//! state changed (say, a copy that is now `Evicting`). Any message to the same node sent after
//! that (in happens-before order; for messages about the same page the slot lock provides it)
//! goes out only after the queue: so the receiver sees the batch's messages before it, in the
//! order they were queued, exactly as if each had been sent alone. Nothing may be sent to a node but through this rule (coherence.rs sends only
//! via `Coherence::send` and `try_send_control`, which flush first).
//!
//! Locks: an outbox's mutex is taken after a slot's shard mutex (queueing happens under the
//! slot lock), never before, and is held while its batch is on the wire, so a thread that
//! finds the outbox empty knows every earlier batch has been handed to the channel.

use crate::coherence::protocol::{Msg, Node};
use crate::coherence::wire::{Attached, BATCH_MAX};
use crate::error::EngineError;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// A queued message: the raw page id and the message.
pub type Queued = (u64, Msg<Attached>);

/// A batch that could not be sent, with the reason.
pub struct Unsent {
    pub to: Node,
    pub msgs: Vec<Queued>,
    pub error: EngineError,
}

struct Outbox {
    /// `msgs` is not empty. Set under the mutex when a message is queued; cleared under the
    /// mutex after the batch was handed to the channel.
    queued: AtomicBool,
    msgs: Mutex<Vec<Queued>>,
}

/// One outbox per node of the cluster.
pub struct Outboxes {
    boxes: Box<[Outbox]>,
}

impl Outboxes {
    pub fn new(nodes: u8) -> Outboxes {
        Outboxes {
            boxes: (0..nodes)
                .map(|_| Outbox {
                    queued: AtomicBool::new(false),
                    msgs: Mutex::new(Vec::new()),
                })
                .collect(),
        }
    }

    /// Queue `msg` about `pid` for `to`; when the outbox is full, send it with `send`.
    pub fn push(
        &self,
        to: Node,
        pid: u64,
        msg: Msg<Attached>,
        send: impl FnOnce(Node, &[Queued]) -> Result<(), EngineError>,
    ) -> Result<(), Unsent> {
        let b = &self.boxes[to as usize];
        let mut msgs = b.msgs.lock();
        msgs.push((pid, msg));
        // Relaxed: readers that must see it hold the slot lock we hold (it orders them), or
        // take the mutex
        b.queued.store(true, Ordering::Relaxed);
        if msgs.len() < BATCH_MAX {
            return Ok(());
        }
        Self::send_locked(b, to, &mut msgs, send)
    }

    /// Send `to`'s queued messages (if any) before anything else goes to it.
    pub fn flush_if_queued(
        &self,
        to: Node,
        send: impl FnOnce(Node, &[Queued]) -> Result<(), EngineError>,
    ) -> Result<(), Unsent> {
        let b = &self.boxes[to as usize];
        // Acquire pairs with the Release clear in `send_locked`: seeing `false` means the last
        // batch was handed to the channel before this thread sends anything. Seeing a stale
        // `true` only costs a lock.
        if !b.queued.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut msgs = b.msgs.lock();
        if msgs.is_empty() {
            return Ok(());
        }
        Self::send_locked(b, to, &mut msgs, send)
    }

    /// Send every node's queued messages; returns the batches that failed.
    pub fn flush(
        &self,
        mut send: impl FnMut(Node, &[Queued]) -> Result<(), EngineError>,
    ) -> Vec<Unsent> {
        (0..self.boxes.len() as Node)
            .filter_map(|to| self.flush_if_queued(to, &mut send).err())
            .collect()
    }

    fn send_locked(
        b: &Outbox,
        to: Node,
        msgs: &mut Vec<Queued>,
        send: impl FnOnce(Node, &[Queued]) -> Result<(), EngineError>,
    ) -> Result<(), Unsent> {
        let r = send(to, msgs);
        let taken = std::mem::take(msgs);
        // Release: the send above happens-before a later `flush_if_queued` that reads false
        b.queued.store(false, Ordering::Release);
        r.map_err(|error| Unsent {
            to,
            msgs: taken,
            error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evict(epoch: u64) -> Msg<Attached> {
        Msg::Evict { epoch, data: None }
    }

    #[test]
    fn queued_messages_leave_in_order_before_anything_else() {
        let o = Outboxes::new(3);
        let wire: std::cell::RefCell<Vec<(Node, Vec<Queued>)>> = Default::default();
        let send = |to: Node, m: &[Queued]| {
            wire.borrow_mut().push((to, m.to_vec()));
            Ok(())
        };
        o.push(1, 10, evict(1), send).ok().unwrap();
        o.push(2, 20, evict(2), send).ok().unwrap();
        o.push(1, 11, Msg::EvictReply { accepted: true }, send)
            .ok()
            .unwrap();
        assert!(wire.borrow().is_empty(), "nothing leaves before a flush");
        // a send to node 1 flushes node 1's outbox only
        o.flush_if_queued(1, send).ok().unwrap();
        assert_eq!(
            *wire.borrow(),
            vec![(
                1,
                vec![(10, evict(1)), (11, Msg::EvictReply { accepted: true })]
            )]
        );
        o.flush_if_queued(1, send).ok().unwrap();
        assert_eq!(wire.borrow().len(), 1, "an empty outbox sends nothing");
        assert!(o.flush(send).is_empty());
        assert_eq!(wire.borrow()[1], (2, vec![(20, evict(2))]));
    }

    #[test]
    fn a_full_outbox_leaves_at_once_and_a_failed_batch_comes_back() {
        let o = Outboxes::new(2);
        let mut sent = 0;
        for i in 0..BATCH_MAX as u64 {
            o.push(1, i, evict(0), |_, m| {
                sent += m.len();
                Ok(())
            })
            .ok()
            .unwrap();
        }
        assert_eq!(sent, BATCH_MAX);
        o.push(1, 7, evict(3), |_, _| unreachable!()).ok().unwrap();
        let failed = o.flush(|to, _| Err(EngineError::PeerDead { node: to }));
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].to, 1);
        assert_eq!(failed[0].msgs, vec![(7, evict(3))]);
        assert!(matches!(failed[0].error, EngineError::PeerDead { node: 1 }));
        // the failed batch is not sent again
        assert!(o.flush(|_, _| unreachable!()).is_empty());
    }
}
