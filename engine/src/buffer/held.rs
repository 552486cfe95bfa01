//! [`HeldFrame`]: a frame latched exclusively by engine code (a fault, the provider, the
//! coherence handler), as opposed to a user's guard.
//!
//! Every way out of holding a frame is a method or the drop:
//!
//! | way out | version | for |
//! |---|---|---|
//! | drop | bumped | the page (or its possession, dirty flag, state) may have changed |
//! | [`HeldFrame::release_unchanged`] | kept | nothing changed: optimistic readers need not restart |
//! | [`HeldFrame::drop_page`] | bumped | the page leaves: unlinked, the frame free again |
//! | [`HeldFrame::into_guarded`] | (the guard's) | the latch passes to an exclusive guard |
//!
//! [`SharedFrame`] is the same for a shared latch (the provider copying a page out).
//!
//! so no path can leave a frame latched, and the "latch, check it still holds the page,
//! else let go unchanged" dance is written once ([`Buffer::try_hold`]).

use super::frame::{Frame, FrameIdx, FrameState, Possession};
use super::latch::Backoff;
use super::page::PageMut;
use super::Buffer;
use crate::pid::Pid;
use shoal_storage::PAGE_SIZE;

/// A frame whose exclusive latch this value holds (see the module docs).
#[must_use = "dropping a held frame releases its latch at once"]
pub(crate) struct HeldFrame<'b> {
    buf: &'b Buffer,
    idx: FrameIdx,
}

impl Buffer {
    /// Latch frame `idx` exclusively if nobody holds it and it still holds page `pid`,
    /// resident. Never waits.
    pub fn try_hold(&self, idx: FrameIdx, pid: Pid) -> Option<HeldFrame<'_>> {
        let f = self.pool.frame(idx);
        if !f.latch.try_lock_exclusive(None) {
            return None;
        }
        let h = HeldFrame { buf: self, idx };
        if f.pid() != pid || f.state() != FrameState::Resident {
            h.release_unchanged();
            return None;
        }
        Some(h)
    }

    /// Latch frame `idx`, whatever it holds, waiting for its holders to leave. Only for frames
    /// nobody can hold for long: a frame just taken from the free frames (a stale reader may
    /// hold it shared for an instant before noticing its pid changed).
    pub(crate) fn hold_free(&self, idx: FrameIdx) -> HeldFrame<'_> {
        let f = self.pool.frame(idx);
        debug_assert_eq!(f.state(), FrameState::Free, "{idx} is not free");
        let mut b = Backoff::new();
        while !f.latch.try_lock_exclusive(None) {
            b.snooze();
        }
        HeldFrame { buf: self, idx }
    }

    /// Latch frame `idx` if nobody holds it, whatever it holds. Never waits.
    pub(crate) fn try_hold_any(&self, idx: FrameIdx) -> Option<HeldFrame<'_>> {
        // (`then`, not `then_some`: a handle built eagerly would unlock on drop a latch that
        // was never taken)
        self.pool
            .frame(idx)
            .latch
            .try_lock_exclusive(None)
            .then(|| HeldFrame { buf: self, idx })
    }
}

impl<'b> HeldFrame<'b> {
    #[inline]
    pub fn idx(&self) -> FrameIdx {
        self.idx
    }

    #[inline]
    pub fn frame(&self) -> &'b Frame {
        self.buf.pool.frame(self.idx)
    }

    /// The page the frame holds now.
    #[inline]
    pub fn pid(&self) -> Pid {
        self.frame().pid()
    }

    /// The frame's page memory (for I/O into it).
    pub fn page_ptr(&self) -> *mut u8 {
        self.buf.pool.page_ptr(self.idx)
    }

    /// Write access to the page.
    pub fn page_mut(&mut self) -> PageMut<'_> {
        // SAFETY: we hold the exclusive latch: the only writer of this page; `&mut self`
        // makes the returned writer unique.
        unsafe { PageMut::from_ptr(self.page_ptr()) }
    }

    /// Set the page's version (kept after the data area; storage/src/page.rs): a page that
    /// arrives from another node keeps the version it had there.
    pub fn set_version(&mut self, v: u64) {
        // SAFETY: the 8 bytes at VERSION_OFF are inside the frame's PAGE_SIZE bytes; we hold
        // the exclusive latch and `&mut self`, so nobody else reads or writes them now
        // (optimistic readers load the data area only, never the trailer).
        unsafe {
            std::ptr::copy_nonoverlapping(
                v.to_le_bytes().as_ptr(),
                self.page_ptr().add(shoal_storage::VERSION_OFF),
                8,
            )
        };
    }

    /// The whole page (data and trailer) as plain bytes, for sending or copying out.
    pub fn bytes(&self) -> &[u8; PAGE_SIZE] {
        // SAFETY: the frame's memory is PAGE_SIZE valid, aligned bytes that live as long as the
        // pool; our exclusive latch excludes every writer while `&self` is borrowed (writes go
        // through `page_mut`, which needs `&mut self`); optimistic readers only load.
        unsafe { &*(self.page_ptr() as *const [u8; PAGE_SIZE]) }
    }

    /// Let go without bumping the version: the holder changed nothing (not the page, nor its
    /// possession, state or dirty flag).
    pub fn release_unchanged(self) {
        let me = std::mem::ManuallyDrop::new(self);
        me.frame().latch.unlock_exclusive_unchanged();
    }

    /// The page leaves the buffer: unlink it from the table, make the frame free, release the
    /// latch with a version bump (optimistic readers of the old page fail validation) and give
    /// the frame back to the free frames. Whatever the page held is dropped: the caller wrote it
    /// back, or it is being deleted, moved to another node or failed to load.
    pub fn drop_page(self) {
        let me = std::mem::ManuallyDrop::new(self);
        let (buf, idx, f) = (me.buf, me.idx, me.frame());
        let pid = f.pid();
        assert!(
            f.latch.is_exclusive() && pid != Pid::NONE,
            "drop_page: {idx} holds {pid}"
        );
        let part = buf.table.lock(pid);
        buf.table.remove(&part, idx);
        drop(part);
        f.set_pid(Pid::NONE);
        f.set_state(FrameState::Free);
        f.set_dirty(false);
        f.set_possession(Possession::None);
        f.latch.unlock_exclusive();
        buf.release_frame(idx);
    }

    /// Hand the latch to a guard, which releases it itself.
    pub fn into_guarded(self) -> FrameIdx {
        std::mem::ManuallyDrop::new(self).idx
    }
}

impl Buffer {
    /// The frame an exclusive guard holds, handed over to engine code (which releases it).
    pub(crate) fn held_by_guard(&self, idx: FrameIdx) -> HeldFrame<'_> {
        debug_assert!(self.pool.frame(idx).latch.is_exclusive());
        HeldFrame { buf: self, idx }
    }
}

impl Drop for HeldFrame<'_> {
    fn drop(&mut self) {
        self.frame().latch.unlock_exclusive();
    }
}

/// A frame whose latch this value holds shared (the provider copying a page out for a
/// write-back): nobody writes the page while it lives. Dropping it releases the latch.
#[must_use = "dropping a shared hold releases its latch at once"]
pub(crate) struct SharedFrame<'b> {
    buf: &'b Buffer,
    idx: FrameIdx,
}

impl Buffer {
    /// Latch frame `idx` shared if no writer holds it. Never waits.
    pub(crate) fn try_hold_shared(&self, idx: FrameIdx) -> Option<SharedFrame<'_>> {
        // (`then`, not `then_some`: see `try_hold_any`)
        self.pool
            .frame(idx)
            .latch
            .try_lock_shared(None)
            .then(|| SharedFrame { buf: self, idx })
    }

    /// Latch frame `idx` shared, waiting for a writer to leave (only where no writer can
    /// hold it long: after the provider stopped and every guard is gone).
    pub(crate) fn hold_shared(&self, idx: FrameIdx) -> SharedFrame<'_> {
        let mut b = Backoff::new();
        loop {
            if let Some(s) = self.try_hold_shared(idx) {
                return s;
            }
            b.snooze();
        }
    }
}

impl<'b> SharedFrame<'b> {
    #[inline]
    pub fn frame(&self) -> &'b Frame {
        self.buf.pool.frame(self.idx)
    }

    /// The whole page (data and trailer) as plain bytes.
    pub fn bytes(&self) -> &[u8; PAGE_SIZE] {
        // SAFETY: the frame's memory is PAGE_SIZE valid, aligned bytes that live as long as the
        // pool; our shared latch excludes every writer while it is held (exclusive holders
        // cannot enter); other readers only load.
        unsafe { &*(self.buf.pool.page_ptr(self.idx) as *const [u8; PAGE_SIZE]) }
    }
}

impl Drop for SharedFrame<'_> {
    fn drop(&mut self) {
        self.frame().latch.unlock_shared();
    }
}
