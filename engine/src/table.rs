//! The translation table: page id -> frame index.
//!
//! A fixed array of bucket heads; each bucket is a chain threaded through the frames' `next`
//! fields (frames carry their pid, so the table stores only indices). Lookups take no lock and
//! write nothing: they walk the chain comparing pids. Inserts and removals take the lock of the
//! bucket's partition (one of [`PARTITIONS`] mutexes), so writers on different partitions never
//! contend and readers never wait.
//!
//! A lock-free lookup is a *hint*: a frame may be unlinked and relinked into another chain while
//! a reader walks it, so the reader can miss a page that is present (it then takes the fault
//! path, which re-checks under the partition lock) or land on a frame that no longer holds the
//! page (the caller re-checks the frame's pid under its latch). Walks are bounded by
//! [`MAX_WALK`] hops, so a walk that is sent in circles by concurrent relinking ends.

use crate::frame::FramePool;
use crate::mapped::MappedSlice;
use crate::pid::Pid;
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU32, Ordering};

/// Number of insert/remove partitions.
pub const PARTITIONS: usize = 256;
/// Longest chain walk before a lookup gives up (and the caller falls back to the locked path).
pub const MAX_WALK: usize = 64;

pub struct TranslationTable {
    heads: MappedSlice<AtomicU32>,
    shift: u32,
    locks: Box<[Mutex<()>]>,
}

/// Proof of holding the partition lock for one pid.
pub struct PartitionLock<'a> {
    _g: MutexGuard<'a, ()>,
    bucket: usize,
}

impl TranslationTable {
    /// A table with at least two buckets per frame.
    pub fn new(frames: usize) -> std::io::Result<Self> {
        let buckets = (frames * 2).next_power_of_two().max(PARTITIONS);
        Ok(TranslationTable {
            heads: MappedSlice::new(buckets, |_| AtomicU32::new(0))?,
            shift: 64 - buckets.trailing_zeros(),
            locks: (0..PARTITIONS).map(|_| Mutex::new(())).collect(),
        })
    }

    #[inline]
    fn bucket(&self, pid: Pid) -> usize {
        (pid.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// Lock-free lookup (a hint, see module docs).
    #[inline]
    pub fn lookup(&self, pool: &FramePool, pid: Pid) -> Option<u32> {
        // Acquire: pairs with the Release in `insert`, so the frame's pid and next written before
        // linking are visible.
        let mut at = self.heads[self.bucket(pid)].load(Ordering::Acquire);
        for _ in 0..MAX_WALK {
            if at == 0 {
                return None;
            }
            // Start loading the page's first lines now, in parallel with the frame descriptor
            // (its pid and latch are the next, dependent, cache miss).
            pool.prefetch_page(at - 1);
            let f = pool.frame(at - 1);
            if f.pid() == pid {
                return Some(at - 1);
            }
            at = f.next.load(Ordering::Acquire);
        }
        None
    }

    /// Hint: `pid`'s bucket will be looked up soon.
    #[inline]
    pub fn prefetch(&self, pid: Pid) {
        crate::mapped::prefetch(&self.heads[self.bucket(pid)] as *const AtomicU32 as *const u8);
    }

    /// Lock the partition of `pid`.
    pub fn lock(&self, pid: Pid) -> PartitionLock<'_> {
        let bucket = self.bucket(pid);
        PartitionLock {
            _g: self.locks[bucket % PARTITIONS].lock(),
            bucket,
        }
    }

    /// Exact lookup under the partition lock.
    pub fn lookup_locked(
        &self,
        pool: &FramePool,
        lock: &PartitionLock<'_>,
        pid: Pid,
    ) -> Option<u32> {
        let mut at = self.heads[lock.bucket].load(Ordering::Relaxed);
        while at != 0 {
            let f = pool.frame(at - 1);
            if f.pid() == pid {
                return Some(at - 1);
            }
            at = f.next.load(Ordering::Relaxed);
        }
        None
    }

    /// Link frame `idx` (whose pid is already set) into its bucket.
    pub fn insert(&self, pool: &FramePool, lock: &PartitionLock<'_>, idx: u32) {
        debug_assert_eq!(self.bucket(pool.frame(idx).pid()), lock.bucket);
        let head = &self.heads[lock.bucket];
        pool.frame(idx)
            .next
            .store(head.load(Ordering::Relaxed), Ordering::Relaxed);
        // Release: publishes the frame's pid and next link to lock-free walkers.
        head.store(idx + 1, Ordering::Release);
    }

    /// Unlink frame `idx` from its bucket. Returns whether it was linked.
    pub fn remove(&self, pool: &FramePool, lock: &PartitionLock<'_>, idx: u32) -> bool {
        let mut link = &self.heads[lock.bucket];
        loop {
            let at = link.load(Ordering::Relaxed);
            if at == 0 {
                return false;
            }
            if at - 1 == idx {
                let next = pool.frame(idx).next.load(Ordering::Relaxed);
                // Release: a walker that reads the new link sees a consistent successor.
                link.store(next, Ordering::Release);
                return true;
            }
            link = &pool.frame(at - 1).next;
        }
    }
}
