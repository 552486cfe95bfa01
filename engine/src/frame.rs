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
use crate::pid::Pid;
use shoal_storage::PAGE_SIZE;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// Frame holds no page and sits in the free queue.
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
        Ok(FramePool {
            frames,
            memory: memory.as_ptr(),
            bytes,
        })
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
        if (idx as usize) < self.frames.len() {
            // idx < count: the addresses lie inside the mapping (and prefetch never faults).
            let base = self.memory.wrapping_add(idx as usize * PAGE_SIZE);
            for l in 0..Self::PREFETCH_LINES {
                crate::mapped::prefetch(base.wrapping_add(l * 64));
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
