//! Durability: the write-ahead log in memory, log groups, commits, transactions, checkpoints,
//! and what recovery leaves the engine to finish (docs/durability.md).
//!
//! | part | where | what |
//! |---|---|---|
//! | the log | `log.rs` | [`Log`]: the ring, group commit, the log writer, checkpoint epochs |
//! | a worker's part | `group.rs` | [`WorkerLog`]: the open log group of a worker's exclusive guards, its transaction |
//! | transactions | `transaction.rs` | a running transaction's undo bookkeeping; [`CommitPoint`] |
//! | a node's part | this file | [`NodeLog`]: opening the log, checkpoints, the write-ahead rule, recovery's leftovers |
//! | counters | `stats.rs` (the engine's counters) | [`LogCounters`] |
//!
//! The store (shoal-storage) keeps the log's on-disk side: its file format, writing stamped
//! flushes, reading it back, and replaying page images into slots at open. Everything here
//! runs on top of that: what goes into the log and when, and what a commit waits for.
//!
//! It must not know about B-trees or guards' operations: the B-tree's undo records are
//! opaque bytes here, rolled back through `EngineConfig::roll_back`.

mod group;
mod log;
#[cfg(test)]
mod log_tests;
mod transaction;

pub use crate::stats::LogCounters;
pub(crate) use group::WorkerLog;
pub(crate) use log::Log;
pub use transaction::CommitPoint;

use crate::error::EngineError;
use parking_lot::Mutex;
use shoal_storage::Unfinished;
use shoal_storage::{OpenedLog, PageStore, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// A node's log, and the transactions a crash cut off that are not rolled back yet.
pub(crate) struct NodeLog {
    log: Arc<Log>,
    cut_off: Mutex<CutOff>,
}

/// Transactions a crash cut off: carried into the log at open, rolled back by the engine.
#[derive(Default)]
struct CutOff {
    txns: Vec<Unfinished>,
    /// LSN of the first carried undo record: checkpoints keep the log from there until the
    /// transactions are rolled back.
    carried_from: Option<u64>,
}

impl NodeLog {
    /// The log over the file the store opened, with the undo records of the transactions
    /// recovery found cut off carried into it (durably) before anything else: if the engine
    /// stops again before they are rolled back, the next recovery finds them there (the old
    /// part of the log is no longer read).
    pub fn open(opened: OpenedLog) -> Result<NodeLog, EngineError> {
        let log = Arc::new(Log::new(opened.file));
        let mut cut = CutOff {
            txns: opened.unfinished,
            carried_from: None,
        };
        let mut buf = Vec::new();
        for u in &cut.txns {
            cut.carried_from.get_or_insert(log.tail());
            log.append(&mut buf, |_, b| {
                for r in &u.undo {
                    shoal_storage::wal::put_undo(b, u.txn, r);
                }
            })?;
        }
        if cut.carried_from.is_some() {
            log.flush_all()?;
            ::log::warn!(
                "{}: {} transaction(s) were cut off by the crash; they must be rolled back",
                log.path().display(),
                cut.txns.len()
            );
        }
        Ok(NodeLog {
            log,
            cut_off: Mutex::new(cut),
        })
    }

    pub fn log(&self) -> &Arc<Log> {
        &self.log
    }

    /// The transactions a crash cut off, not rolled back yet.
    pub fn unfinished(&self) -> Vec<Unfinished> {
        self.cut_off.lock().txns.clone()
    }

    /// Every transaction [`NodeLog::unfinished`] returned was rolled back: log their ends
    /// durably; the log need not keep their undo records any more.
    pub fn unfinished_resolved(&self, txns: &[Unfinished]) -> Result<(), EngineError> {
        let mut b = Vec::new();
        self.log.append(&mut b, |_, b| {
            for u in txns {
                shoal_storage::wal::put_end(b, u.txn);
            }
        })?;
        self.log.flush_all()?;
        *self.cut_off.lock() = CutOff::default();
        Ok(())
    }

    /// The write-ahead rule: the log up to `upto` (the highest LSN of pages about to be
    /// written back) is made durable before any of them reaches the store. If it cannot be,
    /// the error to report for each page (none of them may be written).
    pub fn before_write_back(&self, upto: u64) -> Result<(), impl Fn() -> StoreError + '_> {
        if let Err(e) = self.log.flush_to(upto) {
            let why = e.to_string();
            return Err(move || StoreError::BadLog {
                path: self.log.path().to_path_buf(),
                why: format!(
                    "page not written back: its log records cannot be made durable: {why}"
                ),
            });
        }
        assert!(
            self.log.durable() >= upto,
            "write-ahead rule: page LSN {upto} beyond the durable log"
        );
        Ok(())
    }

    /// The log is more than half full: time for a checkpoint.
    pub fn wants_checkpoint(&self) -> bool {
        self.log.used_bytes() > self.log.capacity_bytes() / 2
    }

    /// Begin a checkpoint (its record at LSN `C`, returned): the caller writes back every page
    /// dirty now, then calls [`NodeLog::finish_checkpoint`] with `C`.
    pub fn begin_checkpoint(&self) -> Result<u64, EngineError> {
        Ok(self.log.begin_checkpoint()?)
    }

    /// Finish the checkpoint begun at `c`: the caller has written back every page dirty at
    /// `c`. Syncs the devices, then records the allocator (after the log holding every
    /// allocation it reflects is durable) and the new redo point. `oldest`: the oldest running
    /// transaction's first LSN (see [`Log::finish_checkpoint`]).
    pub fn finish_checkpoint(
        &self,
        store: &PageStore,
        c: u64,
        oldest: Option<u64>,
    ) -> Result<(), EngineError> {
        store.sync()?;
        // every allocation and free reflected in the copy was logged under the allocator's
        // lock, before the tail read there
        let (alloc, upto) = store.allocator_snapshot(|| self.log.tail());
        self.log.flush_to(upto)?;
        // cut-off transactions' undo records carried at open stay readable until resolved
        let carried = self.cut_off.lock().carried_from;
        let oldest = match (oldest, carried) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(self.log.finish_checkpoint(c, oldest, &alloc)?)
    }

    /// Close, part: a last checkpoint (every dirty page is written back and synced), so that
    /// the next open finds the log's end at once. Refused while transactions cut off by a
    /// crash are not rolled back (the store then stays unclean and the next open recovers it
    /// again).
    pub fn close(&self, store: &PageStore) -> Result<(), EngineError> {
        let n = self.cut_off.lock().txns.len();
        if n > 0 {
            return Err(StoreError::BadLog {
                path: self.log.path().to_path_buf(),
                why: format!(
                    "{n} transaction(s) cut off by a crash were not rolled back; the store stays unclean (the next open recovers it again)"
                ),
            }
            .into());
        }
        let c = self.log.begin_checkpoint()?;
        self.finish_checkpoint(store, c, None)
    }

    /// Start the log writer thread for `durability` (commit: flush as soon as anything is
    /// complete; flush-every-ms: on its tick), so that workers committing without waiting are
    /// acknowledged and nobody waits for a timed flush.
    pub fn start_writer(
        &self,
        node: u8,
        durability: Durability,
    ) -> Result<std::thread::JoinHandle<()>, EngineError> {
        let every = match durability {
            Durability::FlushEveryMs(ms) => Some(Duration::from_millis(ms as u64)),
            _ => None,
        };
        let log = Arc::clone(&self.log);
        std::thread::Builder::new()
            .name(format!("shoal-log-{node}"))
            .spawn(move || {
                if let Err(e) = log.run_writer(every) {
                    ::log::error!("node {node}: the log writer stopped: {e}");
                }
            })
            .map_err(|e| EngineError::Resources {
                what: "the log writer thread".into(),
                source: Arc::new(e),
            })
    }

    /// Stop the log writer (after its current flush).
    pub fn stop_writer(&self) {
        self.log.stop_writer();
    }

    pub fn counters(&self) -> LogCounters {
        self.log.stats.snapshot()
    }
}

/// A store opened as `cfg` says with its log taken over by a [`NodeLog`] (as the engine
/// does), for tests of the log with the store under it.
#[cfg(test)]
pub(crate) fn logged(cfg: &shoal_storage::StoreConfig) -> (PageStore, NodeLog) {
    let mut store = PageStore::open(cfg).expect("the store opens");
    let log = NodeLog::open(store.take_log().expect("a store with a log")).expect("the log opens");
    store.set_slot_log(log.log().clone());
    (store, log)
}

/// When a change survives a crash (kill -9, power loss).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// No log: only a clean close makes changes durable; after a crash the store refuses to
    /// open (unless `allow_unclean`, which loses what was not written back).
    #[default]
    None,
    /// [`crate::Worker::commit`] returns once everything the worker changed is durable
    /// (group commit: one `fdatasync` covers every worker waiting).
    Commit,
    /// The log is flushed every this many milliseconds; `commit` does not wait. A crash loses
    /// at most the last interval's changes, never leaves a page half-changed.
    FlushEveryMs(u32),
}

impl Durability {
    /// Parse `none`, `commit` or `flush-every-ms=N` (or `flush-every-N-ms`).
    pub fn parse(s: &str) -> Result<Durability, String> {
        let t = s.trim();
        match t {
            "none" => return Ok(Durability::None),
            "commit" => return Ok(Durability::Commit),
            _ => {}
        }
        let n = t
            .strip_prefix("flush-every-ms=")
            .or_else(|| t.strip_prefix("flush-every-ms:"))
            .or_else(|| {
                t.strip_prefix("flush-every-")
                    .and_then(|r| r.strip_suffix("ms"))
            });
        match n.map(|n| n.parse::<u32>()) {
            Some(Ok(ms)) if (1..=60_000).contains(&ms) => Ok(Durability::FlushEveryMs(ms)),
            _ => Err(format!(
                "durability must be none, commit or flush-every-ms=N (N in 1..=60000), got {s:?}"
            )),
        }
    }

    pub fn logged(self) -> bool {
        self != Durability::None
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Durability::None => write!(f, "none"),
            Durability::Commit => write!(f, "commit"),
            Durability::FlushEveryMs(n) => write!(f, "flush-every-ms={n}"),
        }
    }
}
