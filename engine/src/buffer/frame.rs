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
//! | `pid`, `state` | fault, eviction, free ([`crate::buffer::HeldFrame`]) | exclusive latch |
//! | `dirty` | set by exclusive guards; cleared by the provider when it copies the page out | exclusive / shared latch |
//! | `last_used` | any accessor (only when it differs from the access clock) | nothing (a hint) |
//! | `possession` | the coherence handler, the provider | exclusive latch (revocation: nothing, a hint) |

use crate::buffer::latch::HybridLatch;
use crate::buffer::mapped::MappedSlice;
use crate::pid::{Pid, MAX_NODES};
use shoal_storage::PAGE_SIZE;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// The index of a frame in its node's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameIdx(pub(crate) u32);

impl FrameIdx {
    /// The index as a `usize` (for slices and offsets).
    #[inline]
    pub fn get(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for FrameIdx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "frame {}", self.0)
    }
}

/// Where a frame is in its life cycle. Changed only under the frame's exclusive latch:
///
/// ```text
/// Free --(fault claims it)--> Loading --(read verified)--> Resident --(drop)--> Free
/// Free --(new page / page arriving from a node)--> Resident
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameState {
    /// Holds no page and is in the free frames ([`crate::buffer::free_frames`]).
    Free = 0,
    /// The page is being read from the store (the fault holds the exclusive latch).
    Loading = 1,
    /// Holds a valid page.
    Resident = 2,
}

/// What local guards may do with a resident frame's page (a cluster node's view of the
/// coherence protocol; a single node holds every page [`Possession::Exclusive`]). Changed only
/// under the exclusive latch, except [`Frame::revoke_possession`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Possession {
    /// Local guards may not use the page: a home copy this node does not hold, a page on its
    /// way, or one whose eviction notice is out.
    None = 0,
    /// Node-shared: optimistic and shared guards.
    Shared = 1,
    /// Node-exclusive: every guard.
    Exclusive = 2,
}

/// Descriptor of one buffer frame. 64-byte aligned so neighbours do not share a cache line.
#[repr(align(64))]
#[derive(Debug)]
pub struct Frame {
    pub latch: HybridLatch,
    pid: AtomicU64,
    state: AtomicU8,
    dirty: AtomicBool,
    /// The access clock's value at the last access ([`Frame::touch`]).
    last_used: AtomicU32,
    possession: AtomicU8,
    /// LSN just past the log chunk holding the page's last change (0: no change logged since
    /// it came into this frame, so its next change is logged whole). Written under the
    /// exclusive latch; the write-ahead rule reads it under the shared one.
    lsn: AtomicU64,
}

impl Frame {
    fn new() -> Self {
        Frame {
            latch: HybridLatch::new(),
            pid: AtomicU64::new(Pid::NONE.0),
            state: AtomicU8::new(FrameState::Free as u8),
            dirty: AtomicBool::new(false),
            last_used: AtomicU32::new(0),
            possession: AtomicU8::new(Possession::None as u8),
            lsn: AtomicU64::new(0),
        }
    }

    /// See the field. Relaxed: read and written under the latch, whose fences order it.
    pub(crate) fn lsn(&self) -> u64 {
        self.lsn.load(Ordering::Relaxed)
    }
    pub(crate) fn set_lsn(&self, lsn: u64) {
        debug_assert!(self.latch.is_exclusive(), "set_lsn without the latch");
        self.lsn.store(lsn, Ordering::Relaxed);
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
        debug_assert!(self.latch.is_exclusive(), "set_pid without the latch");
        self.pid.store(pid.0, Ordering::Relaxed);
        self.lsn.store(0, Ordering::Relaxed);
    }
    #[inline]
    pub fn state(&self) -> FrameState {
        match self.state.load(Ordering::Relaxed) {
            0 => FrameState::Free,
            1 => FrameState::Loading,
            _ => FrameState::Resident,
        }
    }
    /// Whether the frame holds a valid page (a racy snapshot, as [`Frame::pid`]).
    #[inline]
    pub fn is_resident(&self) -> bool {
        self.state() == FrameState::Resident
    }
    /// Caller holds the exclusive latch.
    pub(crate) fn set_state(&self, s: FrameState) {
        debug_assert!(self.latch.is_exclusive(), "set_state without the latch");
        debug_assert!(
            matches!(
                (self.state(), s),
                (FrameState::Free, FrameState::Loading | FrameState::Resident)
                    | (FrameState::Loading, FrameState::Resident | FrameState::Free)
                    | (
                        FrameState::Resident,
                        FrameState::Resident | FrameState::Free
                    )
            ),
            "frame state {:?} -> {s:?}",
            self.state()
        );
        self.state.store(s as u8, Ordering::Relaxed);
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
    pub fn last_used(&self) -> u32 {
        self.last_used.load(Ordering::Relaxed)
    }
    /// What local guards may do with the page. Read under the latch (or validated after an
    /// optimistic read).
    #[inline]
    pub fn possession(&self) -> Possession {
        // Relaxed: changed only under the exclusive latch, whose acquire/release orders it.
        match self.possession.load(Ordering::Relaxed) {
            0 => Possession::None,
            1 => Possession::Shared,
            _ => Possession::Exclusive,
        }
    }
    /// Caller holds the exclusive latch.
    #[inline]
    pub(crate) fn set_possession(&self, p: Possession) {
        debug_assert!(
            self.latch.is_exclusive(),
            "set_possession without the latch"
        );
        debug_assert!(
            p == Possession::None || self.state() == FrameState::Resident,
            "possession {p:?} of a frame that holds no page"
        );
        self.possession.store(p as u8, Ordering::Relaxed);
    }
    /// Turn new guards away without the latch (the coherence handler waits for the current
    /// holders to leave so that it can hand the page over). Holders keep their guards; the
    /// handler sets the real possession under the latch afterwards.
    #[inline]
    pub(crate) fn revoke_possession(&self) {
        // Relaxed: a hint for new acquirers; they read it after taking the latch (or validate
        // after an optimistic read), and the handler's later latched store settles the value.
        self.possession
            .store(Possession::None as u8, Ordering::Relaxed);
    }
    /// Record an access at clock value `now`; writes the cache line only when the value
    /// changes.
    #[inline]
    pub(crate) fn touch(&self, now: u32) {
        if self.last_used.load(Ordering::Relaxed) != now {
            self.last_used.store(now, Ordering::Relaxed);
        }
    }
}

/// The frames of one node and their page memory.
pub struct FramePool {
    frames: MappedSlice<Frame>,
    memory: *mut u8,
    bytes: usize,
    /// Where each node's pages start in the pool's home-frame layout (see [`FramePool::preferred`]).
    preferred_offset: [u64; MAX_NODES],
}

// SAFETY: `memory` is a private anonymous mapping owned by the pool; all access to it goes
// through latches and atomics (see crate::buffer::page), so sharing the pointer across threads is sound.
unsafe impl Send for FramePool {}
// SAFETY: as above.
unsafe impl Sync for FramePool {}

impl FramePool {
    /// Map `count` frames of page memory.
    pub fn new(count: usize) -> std::io::Result<FramePool> {
        let bytes = count
            .checked_mul(PAGE_SIZE)
            .ok_or_else(|| std::io::Error::other("frame pool size overflows"))?;
        let memory = crate::buffer::mapped::map_anonymous(bytes)?;
        let frames = MappedSlice::new(count, |_| Frame::new())?;
        // Node k's pages start at k times the golden ratio's fraction of the pool (mod 1):
        // node 0 at 0, node 1 at 0.62, node 2 at 0.24, ... so that the first pages of every
        // node have different preferred frames while each node's stay contiguous.
        let preferred_offset = std::array::from_fn(|k| {
            (((k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as u128 * count as u128) >> 64) as u64
        });
        Ok(FramePool {
            frames,
            memory: memory.as_ptr(),
            bytes,
            preferred_offset,
        })
    }

    /// The frame that page `pid` takes when it is free: a fixed function of the pid, so that
    /// a reader can start loading a page's frame and first lines *while* it reads the page's
    /// translation entry, instead of after (the entry stays the authority: the guess is only
    /// a prefetch). Slot `s` of node 0 goes to frame `s mod frames`: when the pool is larger
    /// than the data, every page has a preferred frame of its own.
    #[inline]
    pub fn preferred(&self, pid: Pid) -> FrameIdx {
        let n = self.frames.len() as u64;
        let x = pid
            .slot()
            .wrapping_add(self.preferred_offset[pid.node() as usize % MAX_NODES]);
        FrameIdx((if x < n { x } else { x % n.max(1) }) as u32)
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    #[inline]
    pub fn frame(&self, idx: FrameIdx) -> &Frame {
        &self.frames[idx.get()]
    }

    /// Every frame index of the pool, in order.
    pub fn indexes(&self) -> impl Iterator<Item = FrameIdx> {
        (0..self.frames.len() as u32).map(FrameIdx)
    }

    /// Page memory of frame `idx` (page aligned, [`PAGE_SIZE`] bytes, lives as long as the pool).
    #[inline]
    pub fn page_ptr(&self, idx: FrameIdx) -> *mut u8 {
        assert!(idx.get() < self.frames.len());
        // SAFETY: idx < count, so the offset is inside the mapping of count * PAGE_SIZE bytes.
        unsafe { self.memory.add(idx.get() * PAGE_SIZE) }
    }
}

impl FramePool {
    /// Lines of a page prefetched when its frame is found: the header and, for B-tree nodes,
    /// the start of the slot array.
    pub const PREFETCH_LINES: usize = 4;

    /// Hint: frame `idx`'s descriptor (latch, pid, state) and the first
    /// [`Self::PREFETCH_LINES`] lines of its page will be read soon.
    #[inline]
    pub fn prefetch_frame(&self, idx: FrameIdx) {
        if let Some(f) = self.frames.get(idx.get()) {
            crate::buffer::mapped::prefetch((f as *const Frame).cast());
            self.prefetch_page(idx);
        }
    }

    /// Hint: the first [`Self::PREFETCH_LINES`] cache lines of frame `idx`'s page are needed.
    #[inline]
    pub fn prefetch_page(&self, idx: FrameIdx) {
        self.prefetch_range(idx, 0, Self::PREFETCH_LINES * 64);
    }

    /// Hint: bytes `off..off + len` of the page in frame `idx` are needed soon.
    #[inline]
    pub fn prefetch_range(&self, idx: FrameIdx, off: usize, len: usize) {
        if idx.get() < self.frames.len() {
            // idx < count and the end is clamped to the page: the addresses lie inside the
            // mapping (and prefetch never faults anyway).
            let base = self.memory.wrapping_add(idx.get() * PAGE_SIZE);
            let end = off.saturating_add(len).min(PAGE_SIZE);
            let mut o = off & !63;
            while o < end {
                crate::buffer::mapped::prefetch(base.wrapping_add(o));
                o += 64;
            }
        }
    }
}

impl Drop for FramePool {
    fn drop(&mut self) {
        // SAFETY: memory/bytes are the mapping created in `new`; no references outlive the pool
        // (guards borrow the engine, which owns the pool).
        unsafe {
            crate::buffer::mapped::unmap(
                std::ptr::NonNull::new(self.memory).expect("mapped at new"),
                self.bytes,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preferred_frames_are_in_range_and_keep_nodes_apart() {
        let pool = FramePool::new(1000).unwrap();
        // node 0: slot s -> frame s while it fits, wrapping after
        for s in [0u64, 1, 999] {
            assert_eq!(pool.preferred(Pid::new(0, s)), FrameIdx(s as u32));
        }
        assert_eq!(pool.preferred(Pid::new(0, 1000)), FrameIdx(0));
        assert!(pool.preferred(Pid::new(0, (1 << 56) - 1)).get() < 1000);
        // other nodes start elsewhere: node 1 at 618 (golden ratio), and no two of the first
        // 8 nodes share their first page's frame
        assert_eq!(pool.preferred(Pid::new(1, 0)), FrameIdx(618));
        let firsts: std::collections::HashSet<FrameIdx> =
            (0..8).map(|k| pool.preferred(Pid::new(k, 0))).collect();
        assert_eq!(firsts.len(), 8);
        // the "no page" pid maps somewhere harmless
        assert!(pool.preferred(Pid::NONE).get() < 1000);
    }
}
