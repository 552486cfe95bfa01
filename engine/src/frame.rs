//! Buffer frames and the frame pool.
//!
//! The pool is one contiguous, page-aligned anonymous mapping holding every frame's page (this is
//! also the region remote nodes will write pages into), plus an array of [`Frame`] descriptors.
//! A frame's page memory is never unmapped while the engine lives, so an optimistic reader that
//! races with eviction reads another page's bytes, never freed memory; its validation then fails.
//!
//! Frame fields and who may change them:
//!
//! | field | changed by | under |
//! |---|---|---|
//! | `pid`, `state` | fault, eviction, free | exclusive latch |
//! | `dirty` | set by exclusive guards; cleared by the provider when it copies the page out | exclusive / shared latch |
//! | `epoch` | any accessor (only when it differs from the global epoch) | nothing (a hint) |

use crate::latch::HybridLatch;
use crate::mapped::MappedSlice;
use crate::pid::{Pid, MAX_NODES};
use shoal_storage::PAGE_SIZE;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// Frame holds no page and is in the free frames ([`crate::free_frames`]).
pub const FREE: u8 = 0;
/// Frame's page is being read from the store (the fault holds the exclusive latch).
pub const LOADING: u8 = 1;
/// Frame holds a valid page.
pub const RESIDENT: u8 = 2;

/// Possession: local guards may not use the page (a home copy this node does not hold, a page
/// on its way, or one whose eviction notice is out).
pub const POSS_NONE: u8 = 0;
/// Possession: node-shared (optimistic and shared guards).
pub const POSS_SHARED: u8 = 1;
/// Possession: node-exclusive (every guard). A single-node engine holds every page so.
pub const POSS_EXCLUSIVE: u8 = 2;

/// Descriptor of one buffer frame. 64-byte aligned so neighbours do not share a cache line.
#[repr(align(64))]
#[derive(Debug)]
pub struct Frame {
    pub latch: HybridLatch,
    pid: AtomicU64,
    state: AtomicU8,
    dirty: AtomicBool,
    epoch: AtomicU32,
    possession: AtomicU8,
}

impl Frame {
    fn new() -> Self {
        Frame {
            latch: HybridLatch::new(),
            pid: AtomicU64::new(Pid::NONE.0),
            state: AtomicU8::new(FREE),
            dirty: AtomicBool::new(false),
            epoch: AtomicU32::new(0),
            possession: AtomicU8::new(POSS_NONE),
        }
    }

    /// The page this frame holds (a racy snapshot unless the caller holds the latch or
    /// validates afterwards).
    #[inline]
    pub fn pid(&self) -> Pid {
        // Relaxed: callers read this after an Acquire of the latch word and validate after.
        Pid(self.pid.load(Ordering::Relaxed))
    }
    /// Caller holds the exclusive latch.
    pub(crate) fn set_pid(&self, pid: Pid) {
        self.pid.store(pid.0, Ordering::Relaxed);
    }
    #[inline]
    pub fn state(&self) -> u8 {
        self.state.load(Ordering::Relaxed)
    }
    /// Caller holds the exclusive latch.
    pub(crate) fn set_state(&self, s: u8) {
        self.state.store(s, Ordering::Relaxed);
    }
    #[inline]
    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Relaxed)
    }
    /// Caller holds the exclusive latch, or the shared latch when clearing for write-back.
    #[inline]
    pub(crate) fn set_dirty(&self, d: bool) {
        // Relaxed: the flag is read and written under the latch, whose acquire/release orders it.
        if self.dirty.load(Ordering::Relaxed) != d {
            self.dirty.store(d, Ordering::Relaxed);
        }
    }
    #[inline]
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Relaxed)
    }
    /// What local guards may do with the page ([`POSS_NONE`], [`POSS_SHARED`],
    /// [`POSS_EXCLUSIVE`]). Read under the latch (or validated after an optimistic read).
    #[inline]
    pub fn possession(&self) -> u8 {
        // Relaxed: changed only under the exclusive latch, whose acquire/release orders it.
        self.possession.load(Ordering::Relaxed)
    }
    /// Caller holds the exclusive latch.
    #[inline]
    pub(crate) fn set_possession(&self, p: u8) {
        self.possession.store(p, Ordering::Relaxed);
    }
    /// Turn new guards away without the latch (the coherence handler waits for the current
    /// holders to leave so that it can hand the page over). Holders keep their guards; the
    /// handler sets the real possession under the latch afterwards.
    #[inline]
    pub(crate) fn revoke_possession(&self) {
        // Relaxed: a hint for new acquirers; they read it after taking the latch (or validate
        // after an optimistic read), and the handler's later latched store settles the value.
        self.possession.store(POSS_NONE, Ordering::Relaxed);
    }
    /// Record an access in epoch `e`; writes the cache line only when the value changes.
    #[inline]
    pub(crate) fn touch(&self, e: u32) {
        if self.epoch.load(Ordering::Relaxed) != e {
            self.epoch.store(e, Ordering::Relaxed);
        }
    }
}

/// The frames of one node and their page memory.
pub struct FramePool {
    frames: MappedSlice<Frame>,
    memory: *mut u8,
    bytes: usize,
    /// Where each node's pages start in the pool's home-frame layout (see [`FramePool::home`]).
    home_offset: [u64; MAX_NODES],
}

// SAFETY: `memory` is a private anonymous mapping owned by the pool; all access to it goes
// through latches and atomics (see crate::page), so sharing the pointer across threads is sound.
unsafe impl Send for FramePool {}
// SAFETY: as above.
unsafe impl Sync for FramePool {}

impl FramePool {
    /// Map `count` frames of page memory.
    pub fn new(count: usize) -> std::io::Result<FramePool> {
        let bytes = count
            .checked_mul(PAGE_SIZE)
            .ok_or_else(|| std::io::Error::other("frame pool size overflows"))?;
        let memory = crate::mapped::map_anonymous(bytes)?;
        let frames = MappedSlice::new(count, |_| Frame::new())?;
        // Node k's pages start at k times the golden ratio's fraction of the pool (mod 1):
        // node 0 at 0, node 1 at 0.62, node 2 at 0.24, ... so that the first pages of every
        // node have different home frames while each node's stay contiguous.
        let home_offset = std::array::from_fn(|k| {
            (((k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as u128 * count as u128) >> 64) as u64
        });
        Ok(FramePool {
            frames,
            memory: memory.as_ptr(),
            bytes,
            home_offset,
        })
    }

    /// The frame that page `pid` takes when it is free: a fixed function of the pid, so that
    /// a reader can start loading a page's frame and first lines *while* it reads the page's
    /// translation entry, instead of after (the entry stays the authority: the guess is only
    /// a prefetch). Slot `s` of node 0 goes to frame `s mod frames`: when the pool is larger
    /// than the data, every page has a home frame of its own.
    #[inline]
    pub fn home(&self, pid: Pid) -> u32 {
        let n = self.frames.len() as u64;
        let x = pid
            .slot()
            .wrapping_add(self.home_offset[pid.node() as usize % MAX_NODES]);
        (if x < n { x } else { x % n.max(1) }) as u32
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    #[inline]
    pub fn frame(&self, idx: u32) -> &Frame {
        &self.frames[idx as usize]
    }

    /// Page memory of frame `idx` (page aligned, [`PAGE_SIZE`] bytes, lives as long as the pool).
    #[inline]
    pub fn page_ptr(&self, idx: u32) -> *mut u8 {
        assert!((idx as usize) < self.frames.len());
        // SAFETY: idx < count, so the offset is inside the mapping of count * PAGE_SIZE bytes.
        unsafe { self.memory.add(idx as usize * PAGE_SIZE) }
    }
}

impl FramePool {
    /// Lines of a page prefetched when its frame is found: the header and, for B-tree nodes,
    /// the start of the slot array.
    pub const PREFETCH_LINES: usize = 4;

    /// Hint: frame `idx`'s descriptor (latch, pid, state) and the first
    /// [`Self::PREFETCH_LINES`] lines of its page will be read soon.
    #[inline]
    pub fn prefetch_frame(&self, idx: u32) {
        if let Some(f) = self.frames.get(idx as usize) {
            crate::mapped::prefetch((f as *const Frame).cast());
            self.prefetch_page(idx);
        }
    }

    /// Hint: the first [`Self::PREFETCH_LINES`] cache lines of frame `idx`'s page are needed.
    #[inline]
    pub fn prefetch_page(&self, idx: u32) {
        self.prefetch_range(idx, 0, Self::PREFETCH_LINES * 64);
    }

    /// Hint: bytes `off..off + len` of the page in frame `idx` are needed soon.
    #[inline]
    pub fn prefetch_range(&self, idx: u32, off: usize, len: usize) {
        if (idx as usize) < self.frames.len() {
            // idx < count and the end is clamped to the page: the addresses lie inside the
            // mapping (and prefetch never faults anyway).
            let base = self.memory.wrapping_add(idx as usize * PAGE_SIZE);
            let end = off.saturating_add(len).min(PAGE_SIZE);
            let mut o = off & !63;
            while o < end {
                crate::mapped::prefetch(base.wrapping_add(o));
                o += 64;
            }
        }
    }
}

impl Drop for FramePool {
    fn drop(&mut self) {
        // SAFETY: memory/bytes are the mapping created in `new`; no references outlive the pool
        // (guards borrow the engine, which owns the pool).
        unsafe { libc::munmap(self.memory.cast(), self.bytes) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_frames_are_in_range_and_keep_nodes_apart() {
        let pool = FramePool::new(1000).unwrap();
        // node 0: slot s -> frame s while it fits, wrapping after
        for s in [0u64, 1, 999] {
            assert_eq!(pool.home(Pid::new(0, s)), s as u32);
        }
        assert_eq!(pool.home(Pid::new(0, 1000)), 0);
        assert!(pool.home(Pid::new(0, (1 << 56) - 1)) < 1000);
        // other nodes start elsewhere: node 1 at 618 (golden ratio), and no two of the first
        // 8 nodes share their first page's frame
        assert_eq!(pool.home(Pid::new(1, 0)), 618);
        let firsts: std::collections::HashSet<u32> =
            (0..8).map(|k| pool.home(Pid::new(k, 0))).collect();
        assert_eq!(firsts.len(), 8);
        // the "no page" pid maps somewhere harmless
        assert!(pool.home(Pid::NONE) < 1000);
    }
}
