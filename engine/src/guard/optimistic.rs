//! [`OptimisticGuard`]: read, then validate; the page may change or go meanwhile.

use super::*;

/// Optimistic access: read, then [`validate`](Self::validate). Reads may return garbage if the
/// page changed; nothing read may be trusted (or used to index memory) before validation.
#[derive(Clone)]
pub struct OptimisticGuard<'w> {
    pub(super) w: &'w Worker,
    pub(super) idx: FrameIdx,
    pub(super) pid: Pid,
    pub(super) version: u64,
}

impl<'w> OptimisticGuard<'w> {
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// The page's bytes (atomic, total reads: see [`PageRef`]).
    #[inline]
    pub fn page(&self) -> PageRef<'w> {
        self.w.page_ref(self.idx)
    }

    /// Which frame held the page and its version when the guard was taken: two equal stamps
    /// of a page mean it did not change in between (a frame's version grows with every
    /// change and every page it takes in or lets go). A transaction's read set records it.
    #[inline]
    pub fn stamp(&self) -> PageStamp {
        PageStamp {
            frame: self.idx.0,
            version: self.version,
        }
    }

    /// Whether the page is unchanged (and still this page) since the guard was taken.
    #[inline]
    pub fn is_valid(&self) -> bool {
        self.w.frame(self.idx).latch.validate(self.version)
    }

    /// `Ok` if nothing changed since the guard was taken, else [`Restart::Retry`].
    #[inline]
    pub fn validate(&self) -> OpResult<()> {
        if self.is_valid() {
            Ok(())
        } else {
            Err(Restart::Retry)
        }
    }

    /// Become a shared guard, if the page is unchanged.
    pub fn to_shared(self) -> OpResult<SharedGuard<'w>> {
        let f = self.w.frame(self.idx);
        let mut backoff = Backoff::new();
        loop {
            if f.latch.try_lock_shared(Some(self.version)) {
                return Ok(SharedGuard::new(self.w, self.idx, self.pid));
            }
            if !self.is_valid() {
                return Err(Restart::Retry);
            }
            Worker::snooze(&mut backoff)?; // CAS lost to another sharer; the version is unchanged
        }
    }

    /// Become an exclusive guard if the page is unchanged, without waiting for anyone: for a
    /// caller that already holds exclusive guards (a transaction's commit), which must not wait
    /// while it holds them. `Ok(None)`: shared holders are still in after a few backoff steps
    /// (nothing changed; the caller lets its guards go and tries again later);
    /// [`Restart::Retry`]: the page changed.
    pub fn try_exclusive(self) -> OpResult<Option<ExclusiveGuard<'w>>> {
        const TRIES: u32 = 8;
        let f = self.w.frame(self.idx);
        let mut backoff = Backoff::new();
        for _ in 0..TRIES {
            if f.latch.try_lock_exclusive(Some(self.version)) {
                return ExclusiveGuard::converted(self.w, self.idx, self.pid).map(Some);
            }
            if !self.is_valid() {
                return Err(Restart::Retry);
            }
            Worker::snooze(&mut backoff)?;
        }
        Ok(None)
    }

    /// Become an exclusive guard, if the page is unchanged. Waits for shared holders to leave.
    pub fn to_exclusive(self) -> OpResult<ExclusiveGuard<'w>> {
        let f = self.w.frame(self.idx);
        let mut backoff = Backoff::new();
        loop {
            if f.latch.try_lock_exclusive(Some(self.version)) {
                return ExclusiveGuard::converted(self.w, self.idx, self.pid);
            }
            if !self.is_valid() {
                return Err(Restart::Retry);
            }
            Worker::snooze(&mut backoff)?; // shared holders present; they do not change the version
        }
    }
}
