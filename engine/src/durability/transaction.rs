//! A worker's transaction ([`crate::Worker::begin_transaction`]) and the point in the log a
//! commit waits for ([`CommitPoint`]).
//!
//! A transaction here is atomic across a crash: its undo records go into the log with the
//! changes they undo, and an END record closes it; recovery hands the undo records of a
//! transaction without an END to the layer that wrote them (docs/durability.md,
//! "Transactions").

use super::log::Log;
use crate::error::EngineError;
use crate::pid::Pid;
use shoal_storage::wal::{put_end, put_undo};
use std::sync::atomic::{AtomicU64, Ordering};

/// A point in the log ([`crate::Worker::commit_later`]): the commit is durable once the log
/// is durable up to here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[must_use = "a commit is durable only once is_durable(point) says so"]
pub struct CommitPoint(pub(crate) u64);

impl CommitPoint {
    /// A commit that needs nothing from the log (no log, or nothing logged).
    pub(crate) const NOW: CommitPoint = CommitPoint(0);
}

/// A transaction of one worker.
#[derive(Debug, Default)]
pub(crate) struct Tx {
    /// Its id: the LSN of the chunk with its first undo record (0: none placed yet).
    pub id: u64,
    /// Its owner is undoing it: operations log no more undo.
    pub rolling_back: bool,
    /// Pages to free once it ends ([`crate::Worker::free_when_committed`]).
    pub frees: Vec<Pid>,
}

impl Tx {
    /// Whether operations log undo now (not being rolled back).
    pub fn logs_undo(&self) -> bool {
        !self.rolling_back
    }

    /// Encode `undo` into `out` (the open group's undo records). The first undo record of the
    /// transaction says 0 for "the chunk this goes in": its LSN becomes the id. `first` is
    /// the worker's marker of its oldest transaction (`WorkerStats::tx_first`): set to the
    /// log's tail before the first undo chunk is placed, so checkpoints keep the log from
    /// there.
    pub fn put_undo(&self, log: &Log, first: &AtomicU64, out: &mut Vec<u8>, undo: &[u8]) {
        debug_assert!(self.logs_undo(), "undo logged while rolling back");
        if self.id == 0 && out.is_empty() {
            // SeqCst: see `Node::oldest_transaction`
            let t = log.tail();
            if first.load(Ordering::Relaxed) == 0 {
                first.store(t, Ordering::SeqCst);
            }
        }
        put_undo(out, self.id, undo);
    }

    /// The chunk holding the transaction's first undo records was placed at `lsn`.
    pub fn placed(&mut self, lsn: u64) {
        if self.id == 0 {
            self.id = lsn; // its first undo records said 0: "this chunk"
        }
        assert_ne!(self.id, 0, "a placed transaction has an id");
    }

    /// End it: an END record if it logged undo, and the marker of its first undo cleared.
    /// Returns the pages to free now that it ended.
    pub fn end(self, log: &Log, first: &AtomicU64) -> Result<Vec<Pid>, EngineError> {
        if self.id != 0 {
            let mut b = Vec::with_capacity(16);
            log.append(&mut b, |_, b| put_end(b, self.id))?;
        }
        first.store(0, Ordering::Release);
        Ok(self.frees)
    }
}
