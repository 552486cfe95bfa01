//! Counters. Each worker owns a cache-line-aligned block that only its thread writes (so
//! increments are plain relaxed load+store, no locked instruction); readers sum all blocks.

use std::sync::atomic::{AtomicU64, Ordering};

/// Per-worker counters (written by the owning thread only).
#[repr(align(64))]
#[derive(Debug, Default)]
pub struct WorkerStats {
    pub hits: AtomicU64,
    pub faults: AtomicU64,
    pub restarts: AtomicU64,
}

/// Add one to a counter that only the calling thread writes.
#[inline]
pub fn bump(c: &AtomicU64) {
    bump_by(c, 1);
}

/// Add `n` to a per-worker counter (same rules as [`bump`]).
#[inline]
pub fn bump_by(c: &AtomicU64, n: u64) {
    // Relaxed load+store: single writer, readers only need an eventually-consistent sum.
    c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

/// Engine-wide counters written by the page provider (and faults, rarely).
#[derive(Debug, Default)]
pub struct EngineCounters {
    pub evictions: AtomicU64,
    pub writebacks: AtomicU64,
    pub write_errors: AtomicU64,
    pub provider_rounds: AtomicU64,
}

/// A point-in-time sum of all counters of a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Page accesses served from a resident frame.
    pub hits: u64,
    /// Page accesses that had to read the page from the store.
    pub faults: u64,
    /// Optimistic operations restarted.
    pub restarts: u64,
    pub evictions: u64,
    /// Dirty pages written back by the provider or at shutdown.
    pub writebacks: u64,
    pub write_errors: u64,
    pub store_reads: u64,
    pub store_writes: u64,
    pub frames: u64,
    pub free_frames: u64,
    /// The access clock (advanced by the provider as pages cycle through the cache).
    pub clock: u64,
    /// Workers registered now (dropped workers leave; their counts stay in the totals).
    pub live_workers: u64,
    /// The write-ahead log's counters (zero without a log).
    pub log: LogCounters,
}

/// Counters of the coherence protocol at one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProtocolStats {
    /// Possession requests sent by this node's workers (remote misses).
    pub requests: u64,
    /// Messages sent to other nodes.
    pub messages: u64,
    /// Pages sent to other nodes.
    pub pages: u64,
    /// Eviction notices sent.
    pub evict_notices: u64,
    /// Batches sent (one message carrying several eviction notices or replies).
    pub batches: u64,
    /// Messages the handler had to hold and retry (latched page, no free frame, reserved).
    pub held: u64,
    /// Messages applied by threads that waited for an answer (this node's workers, on `mem`
    /// also other nodes' workers) rather than by the node's handler thread.
    pub helped: u64,
    /// Home copies read from the store for other nodes' or own requests (outside the handler
    /// role, by whichever thread takes the read).
    pub home_reads: u64,
    /// One pool: shared requests for pages homed here whose copy was not in memory, sent to a
    /// node holding a copy instead of read from this node's store (NVMe reads avoided).
    pub forwarded_reads: u64,
    /// One pool: pages this node sent from its DRAM to another node in place of the page's
    /// home store (it served a forwarded read and kept its copy).
    pub served_for_others: u64,
    /// One pool: evicted pages of this home offered to a peer with room.
    pub offers: u64,
    /// One pool: offered pages a peer took (given away instead of left only on NVMe).
    pub given_away: u64,
    /// One pool: pages other homes offered that this node took in.
    pub taken_in: u64,
    /// With a log: flushes made because a page with changes not yet durable was about to
    /// leave this node (docs/durability.md, "Clusters").
    pub flushes_before_send: u64,
    /// With a log: messages held (and retried) until the log writer made the changes of the
    /// page they would send durable.
    pub held_for_log: u64,
    /// With a log: pages that arrived dirty and were logged whole here.
    pub logged_on_arrival: u64,
    /// Pages evicted home dirty that this home declined because its log was nearly full
    /// (the evicting node keeps its copy): logging them would take the room its checkpoint
    /// needs (docs/durability.md, "Clusters").
    pub evictions_declined_for_log: u64,
    /// This node's eviction notices that their home declined (the copy stays here).
    pub evictions_declined: u64,
    /// With a log: of those, pages logged whole again when applied, because a checkpoint
    /// began between their arrival and their application.
    pub relogged_after_checkpoint: u64,
    /// Times a worker found this node's lease from a page's home run out and waited for a
    /// new one (docs/protocol.md, "Fencing": the home did not answer a ping for a while).
    pub lease_waits: u64,
    /// At this home: sharers forgotten because they died and their lease ran out (each as a
    /// clean eviction; the page is served again without them).
    pub dead_sharers_forgotten: u64,
    /// Pages this node asked its home for again because the node that was to hand them over
    /// died first: a forwarded read's serving sharer, or an exclusive grant's previous holder
    /// (docs/protocol.md, "Failures").
    pub reads_asked_again: u64,
    /// At this home: forwarded reads whose serving sharer died before its copy-back came;
    /// the home stopped waiting for it once its fence held, instead of losing the page.
    pub dead_servers_forgotten: u64,
    /// At this home: pages granted to a node that died (fenced) reclaimed from the grant's
    /// source, which may still have held them (docs/protocol.md, "Failures").
    pub grants_reclaimed: u64,
    /// Peers this node severed because they answered no ping for the remote timeout
    /// (stopped, cut off or hung; never on `mem`).
    pub peers_severed_silent: u64,
    /// Peers this node found dead (killed, severed, their connection closed).
    pub deaths_noticed: u64,
    /// Of those, peers whose fence came to hold here: their leases on this node's pages ran
    /// out, and this home took over from them (docs/protocol.md, "Fencing").
    pub fences_held: u64,
    /// With a log: checkpoints finished although a dead peer could not answer their log
    /// fence; this node's records of the pages it had handed that peer were carried over
    /// instead (docs/durability.md, "Clusters").
    pub checkpoints_past_dead: u64,
    /// With a log: records those checkpoints carried over (into the log's carried file).
    pub records_carried: u64,
    /// Restarted peers this node took back into the running cluster (docs/protocol.md,
    /// "Rejoin").
    pub rejoins: u64,
    /// Pages of this home lost with a node that died holding them, brought back from the
    /// cluster's logs when that node restarted (docs/protocol.md, "Rejoin").
    pub pages_brought_back: u64,
    /// Of this home's pages lost with a restarted node that their directory entries could
    /// not bring back, those served again after every live node said what it holds of them
    /// (the census: brought back from the logs, or found held by a live node).
    pub pages_censused: u64,
    /// The longest take-back of a restarted peer here, in milliseconds: from its connection
    /// attempt until this node took it back (waiting for this node's fence and the others'
    /// `Settle`, bringing pages back, the census).
    pub longest_take_back_ms: u64,
    /// This node restarted into a running cluster: milliseconds its open took, from the live
    /// nodes having taken it back (its connections) until it served again (its store
    /// recovered from every node's log); 0 otherwise. The take-back before it: the running
    /// nodes' `longest_take_back_ms`.
    pub rejoin_ms: u64,
    /// Invalidation acks of dead sharers counted as given once their fence held (an upgrade
    /// that waited for one completes instead of losing the page).
    pub acks_of_fenced: u64,
}

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
