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
    /// The log's tail just before the first undo record of the worker's running transaction
    /// (0: none): checkpoints keep the log from there (`Node::oldest_transaction`).
    pub tx_first: AtomicU64,
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
    pub log: crate::durability::LogCounters,
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
}
