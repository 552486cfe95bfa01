//! The log's counters: [`LogStats`] (live atomics) and [`LogCounters`] (a copy at one moment).

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one log (all since open).
#[derive(Debug, Default)]
pub(crate) struct LogStats {
    pub chunks: AtomicU64,
    /// Whole page images logged (the first change of a page after a checkpoint began).
    pub images: AtomicU64,
    /// Commits that asked for durability (blocking or not).
    pub commits: AtomicU64,
    pub flushes: AtomicU64,
    pub bytes_written: AtomicU64,
    pub sync_nanos: AtomicU64,
    pub sync_max_nanos: AtomicU64,
    pub checkpoints: AtomicU64,
    /// Flushes that waited for a checkpoint to free log space.
    pub full_waits: AtomicU64,
}

/// A copy of a log's counters at one moment (all since the engine opened).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogCounters {
    /// Chunks appended (a worker's group of changes, a commit's end record, ...).
    pub chunks: u64,
    /// Whole page images logged (the first change of a page after a checkpoint began).
    pub images: u64,
    /// Commits that asked for durability (blocking or not).
    pub commits: u64,
    pub flushes: u64,
    pub bytes_written: u64,
    pub sync_nanos: u64,
    /// The longest single fdatasync since open (not a difference in [`LogCounters::since`]).
    pub sync_max_nanos: u64,
    pub checkpoints: u64,
    /// Flushes that waited for a checkpoint to free log space.
    pub full_waits: u64,
}

impl LogStats {
    pub fn snapshot(&self) -> LogCounters {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LogCounters {
            chunks: l(&self.chunks),
            images: l(&self.images),
            commits: l(&self.commits),
            flushes: l(&self.flushes),
            bytes_written: l(&self.bytes_written),
            sync_nanos: l(&self.sync_nanos),
            sync_max_nanos: l(&self.sync_max_nanos),
            checkpoints: l(&self.checkpoints),
            full_waits: l(&self.full_waits),
        }
    }
}

impl LogCounters {
    /// What happened between `earlier` and `self` (the maximum stays the later one's).
    pub fn since(&self, earlier: &LogCounters) -> LogCounters {
        LogCounters {
            chunks: self.chunks - earlier.chunks,
            images: self.images - earlier.images,
            commits: self.commits - earlier.commits,
            flushes: self.flushes - earlier.flushes,
            bytes_written: self.bytes_written - earlier.bytes_written,
            sync_nanos: self.sync_nanos - earlier.sync_nanos,
            sync_max_nanos: self.sync_max_nanos,
            checkpoints: self.checkpoints - earlier.checkpoints,
            full_waits: self.full_waits - earlier.full_waits,
        }
    }

    /// One readable line: log MB/s, commits per flush, fdatasync mean and max.
    pub fn summary(&self, secs: f64) -> String {
        let per_flush = |n: u64| n as f64 / self.flushes.max(1) as f64;
        format!(
            "{:.1} MB/s, {:.0} flushes/s, {:.1} commits/flush, fdatasync mean {:.0} us max {:.0} us, {:.0} whole images/s, {} checkpoints, {} waits for space",
            self.bytes_written as f64 / 1e6 / secs,
            self.flushes as f64 / secs,
            per_flush(self.commits),
            per_flush(self.sync_nanos) / 1e3,
            self.sync_max_nanos as f64 / 1e3,
            self.images as f64 / secs,
            self.checkpoints,
            self.full_waits
        )
    }
}
