//! [`SharedGuard`]: the page is fixed and read-only while it is held.

use super::*;

/// Shared access: the page is fixed and nobody writes it while this guard lives.
pub struct SharedGuard<'w> {
    pub(super) w: &'w Worker,
    pub(super) idx: FrameIdx,
    pub(super) pid: Pid,
}

impl<'w> SharedGuard<'w> {
    pub(super) fn new(w: &'w Worker, idx: FrameIdx, pid: Pid) -> SharedGuard<'w> {
        w.hold();
        SharedGuard { w, idx, pid }
    }

    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// The page's data area as plain bytes.
    pub fn data(&self) -> &[u8] {
        // SAFETY: we hold the latch shared, so no thread writes this memory until we release
        // (exclusive holders are excluded; the provider only reads). Concurrent optimistic
        // readers only load. The memory lives as long as the engine.
        unsafe {
            std::slice::from_raw_parts(self.w.node.buffer().page_ptr(self.idx), PAGE_DATA_SIZE)
        }
    }

    /// The page's bytes through the same accessors optimistic readers use.
    pub fn page(&self) -> PageRef<'_> {
        self.w.page_ref(self.idx)
    }

    /// Become exclusive if we are the only sharer; otherwise release and [`Restart::Retry`].
    pub fn to_exclusive(self) -> OpResult<ExclusiveGuard<'w>> {
        let me = ManuallyDrop::new(self);
        let f = me.w.frame(me.idx);
        me.w.unhold();
        if f.latch.try_upgrade_shared() {
            ExclusiveGuard::converted(me.w, me.idx, me.pid)
        } else {
            f.latch.unlock_shared();
            Err(Restart::Retry)
        }
    }
}

impl Drop for SharedGuard<'_> {
    fn drop(&mut self) {
        self.w.frame(self.idx).latch.unlock_shared();
        self.w.unhold();
    }
}
