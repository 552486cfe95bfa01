//! The cluster barrier: every node's n-th call meets the others' n-th.

use super::protocol::Node;
use super::wire::Control;
use super::Coherence;
use crate::buffer::Buffer;
use crate::error::EngineError;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One node's side of the barrier.
#[derive(Default)]
pub(super) struct Barrier {
    /// Number of the last barrier this node entered; held while a barrier runs (further
    /// callers of the node queue).
    generation: Mutex<u64>,
    /// Per barrier number, the nodes that arrived (a peer may be a barrier ahead of us).
    arrived: Mutex<HashMap<u64, u64>>,
    /// `generation`, for readers that must not wait while a barrier runs (Relaxed: a
    /// restarted node is told the barriers entered up to it, `Coherence::tell_barriers`).
    entered: AtomicU64,
}

impl Barrier {
    /// `from` arrived at barrier number `generation` (its `Control::Arrive`).
    pub(super) fn arrive(&self, from: Node, generation: u64) {
        *self.arrived.lock().entry(generation).or_insert(0) |= 1u64 << from;
    }

    /// Forget `from`'s arrivals: its old incarnation's do not count for a restarted one.
    pub(super) fn forget(&self, from: Node) {
        for set in self.arrived.lock().values_mut() {
            *set &= !(1u64 << from);
        }
    }

    /// The nodes of `others` that have not arrived at barrier `generation` yet.
    fn missing(&self, generation: u64, others: u64) -> u64 {
        others & !self.arrived.lock().get(&generation).copied().unwrap_or(0)
    }
}

impl Coherence {
    /// Tell restarted node `n` every barrier this node has entered (its barriers count from
    /// the first again: it passes at once those the others are past, and its next meets
    /// theirs).
    pub(super) fn tell_barriers(&self, n: Node) {
        for g in 1..=self.barrier.entered.load(Ordering::Relaxed) {
            if let Err(e) = self.try_send_control(n, &Control::Arrive { generation: g }) {
                log::warn!("node {}: telling node {n} of barrier {g}: {e}", self.me);
                return;
            }
        }
    }

    /// Block until every node of the cluster entered its barrier of the same number (each
    /// node's n-th call meets the others' n-th). Fails if a node died or `limit` passed.
    pub fn barrier(&self, buf: &Buffer, limit: Duration) -> Result<(), EngineError> {
        let b = &self.barrier;
        let mut gen = b.generation.lock();
        *gen += 1;
        let g = *gen;
        b.entered.store(g, Ordering::Relaxed);
        let others: u64 = (0..self.nodes)
            .filter(|&n| n != self.me)
            .fold(0, |m, n| m | (1u64 << n));
        for n in 0..self.nodes {
            if n != self.me {
                self.try_send_control(n, &Control::Arrive { generation: g })?;
            }
        }
        let r = self.wait_until(
            buf,
            limit,
            || {
                // (a cluster of one node waits for nobody: no entry, `others` is 0)
                let mut a = b.arrived.lock();
                (a.get(&g).copied().unwrap_or(0) == others).then(|| a.remove(&g))
            },
            || {
                let m = b.missing(g, others);
                (0..self.nodes).find(|&n| m & (1 << n) != 0 && !self.driver.ch.peer_alive(n))
            },
        )?;
        match r {
            Some(_) => Ok(()),
            None => {
                let m = b.missing(g, others);
                Err(EngineError::BarrierTimeout {
                    generation: g,
                    late: (0..self.nodes).filter(|&n| m & (1 << n) != 0).collect(),
                    ms: limit.as_millis() as u64,
                })
            }
        }
    }
}
