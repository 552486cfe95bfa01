//! Durability: the write-ahead log in memory, log groups, commits, transactions, checkpoints,
//! and what recovery leaves the engine to finish (docs/durability.md).
//!
//! | part | where | what |
//! |---|---|---|
//! | the log | `log.rs` | [`Log`]: the ring, group commit, the log writer, checkpoint epochs |
//! | a worker's part | `group.rs` | [`WorkerLog`]: the open log group of a worker's exclusive guards (one chunk, all of it or nothing after a crash), commits |
//! | a node's part | this file | [`NodeLog`]: opening the log, checkpoints, the write-ahead rule; [`CommitPoint`] |
//! | counters | `stats.rs` (the engine's counters) | [`LogCounters`] |
//!
//! The store (shoal-storage) keeps the log's on-disk side: its file format, writing stamped
//! flushes, reading it back, and replaying page images into slots at open. Everything here
//! runs on top of that: what goes into the log and when, and what a commit waits for.
//!
//! Transactions (shoal-btree's `Transaction`) write nothing before they commit and then log all
//! their changes as one group: nothing here ever needs undoing.
//!
//! It must not know about B-trees or guards' operations.

mod group;
mod log;
#[cfg(test)]
mod log_tests;

pub use crate::stats::LogCounters;
pub(crate) use group::WorkerLog;
pub(crate) use log::Log;

use crate::error::EngineError;
use shoal_storage::{OpenedLog, PageStore, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// A point in the log ([`crate::Worker::commit_later`]): the commit is durable once the log
/// is durable up to here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[must_use = "a commit is durable only once is_durable(point) says so"]
pub struct CommitPoint(pub(crate) u64);

impl CommitPoint {
    /// A commit that needs nothing from the log (no log, or nothing logged).
    pub(crate) const NOW: CommitPoint = CommitPoint(0);
}

/// A node's log.
pub(crate) struct NodeLog {
    log: Arc<Log>,
}

impl NodeLog {
    /// The log over the file the store opened (a log of an older build holding transactions
    /// a crash cut off was refused by the store's recovery: `StoreError::OldTransactions`).
    pub fn open(opened: OpenedLog) -> Result<NodeLog, EngineError> {
        Ok(NodeLog {
            log: Arc::new(Log::new(opened.file)),
        })
    }

    pub fn log(&self) -> &Arc<Log> {
        &self.log
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
    /// allocation it reflects is durable) and the new redo point. `all_fenced`: every peer of
    /// a cluster answered this checkpoint's log fence (always, on a single node).
    pub fn finish_checkpoint(
        &self,
        store: &PageStore,
        c: u64,
        all_fenced: bool,
    ) -> Result<(), EngineError> {
        store.sync()?;
        // every allocation and free reflected in the copy was logged under the allocator's
        // lock, before the tail read there
        let (alloc, upto) = store.allocator_snapshot(|| self.log.tail());
        self.log.flush_to(upto)?;
        self.log.finish_checkpoint(c, &alloc)?;
        if !all_fenced {
            // a dead peer's recovery is still to come: it reads what was carried for it
            return Ok(());
        }
        // A cluster node's checkpoint fenced every peer first: all of them run, so all have
        // recovered and read what the last recovery (or a checkpoint past a dead peer)
        // carried over for them (shoal_storage::wal::carried). A single node has no such file.
        Ok(shoal_storage::wal::carried::remove_carried(
            self.log.path(),
        )?)
    }

    /// Close, part: a last checkpoint (every dirty page is written back and synced), so that
    /// the next open finds the log's end at once.
    pub fn close(&self, store: &PageStore) -> Result<(), EngineError> {
        let c = self.log.begin_checkpoint()?;
        self.finish_checkpoint(store, c, true)
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
///
/// The default is [`Durability::Commit`]: a commit that returned is never lost. It is the only
/// choice under which "committed" means what a user of a database expects without reading
/// further, so an engine opened without choosing gets it; the others trade that promise for
/// speed and must be asked for (docs/durability.md, "Choosing").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// No log: only a clean close makes changes durable; after a crash the store refuses to
    /// open (unless `allow_unclean`, which loses what was not written back). For speed runs
    /// and the default of cluster nodes.
    None,
    /// [`crate::Worker::commit`] returns once everything the worker changed is durable
    /// (group commit: one `fdatasync` covers every worker waiting). The default.
    #[default]
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
