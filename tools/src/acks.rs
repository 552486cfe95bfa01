//! Commits acknowledged when they are durable (`--durability commit`): a worker commits
//! without waiting ([`Worker::commit_later`]) and goes on with its next operation; each commit
//! is counted, and its latency taken, when the log is durable past its point. This is how a
//! server answers its clients with group commit: no answer before the log is on the device,
//! but no thread idles while the device works.

use shoal_engine::{CommitPoint, EngineError, Worker};
use std::collections::VecDeque;
use std::time::Instant;

/// The commits one worker has waiting for the log, oldest first.
pub struct Acks<T> {
    pending: VecDeque<(CommitPoint, Instant, T)>,
    /// At most this many wait at once (0: every commit waits for its flush).
    limit: usize,
}

impl<T> Acks<T> {
    pub fn new(limit: usize) -> Acks<T> {
        Acks {
            pending: VecDeque::with_capacity(limit.min(1 << 16)),
            limit,
        }
    }

    /// Queue a commit begun at `t0`; `done(t0, tag)` is called when it is durable (now, if
    /// the limit is 0 or reached: then this waits for the oldest).
    pub fn push(
        &mut self,
        w: &Worker,
        point: CommitPoint,
        t0: Instant,
        tag: T,
        mut done: impl FnMut(Instant, T),
    ) -> Result<(), EngineError> {
        self.pending.push_back((point, t0, tag));
        while self.pending.len() > self.limit {
            let (p, t, tag) = self.pending.pop_front().expect("not empty");
            w.wait_durable(p)?;
            done(t, tag);
        }
        self.poll(w, done)
    }

    /// Acknowledge every commit that is durable now (one atomic load when none is).
    pub fn poll(
        &mut self,
        w: &Worker,
        mut done: impl FnMut(Instant, T),
    ) -> Result<(), EngineError> {
        while let Some((p, _, _)) = self.pending.front() {
            if !w.is_durable(*p)? {
                break;
            }
            let (_, t, tag) = self.pending.pop_front().expect("not empty");
            done(t, tag);
        }
        Ok(())
    }

    /// Wait for every commit still pending.
    pub fn drain(
        &mut self,
        w: &Worker,
        mut done: impl FnMut(Instant, T),
    ) -> Result<(), EngineError> {
        if let Some((p, _, _)) = self.pending.back() {
            w.wait_durable(*p)?;
        }
        self.poll(w, &mut done)
    }
}
