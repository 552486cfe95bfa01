//! [`ExclusiveGuard`]: the page is fixed and only this guard writes it; its changes are
//! logged (with a log) when it is dropped.

use super::*;

/// Exclusive access: the only writer; the page is fixed and will be written back.
pub struct ExclusiveGuard<'w> {
    pub(super) w: &'w Worker,
    pub(super) idx: FrameIdx,
    pub(super) pid: Pid,
    /// What this guard wrote (for the write-ahead log).
    pub(super) changed: Changed,
}

impl<'w> ExclusiveGuard<'w> {
    /// Finish acquiring: refuse new writes after shutdown, mark the page dirty.
    pub(super) fn start(w: &'w Worker, idx: FrameIdx, pid: Pid) -> OpResult<ExclusiveGuard<'w>> {
        let f = w.frame(idx);
        if w.node.buffer().is_shutdown() {
            f.latch.unlock_exclusive_unchanged();
            return Err(Restart::Fail(EngineError::Shutdown));
        }
        if let Some(Err(e)) = w.log.as_ref().map(|l| l.log().check_failed()) {
            // a failed log takes no more changes (`Log::fail`): the page stays as it is
            f.latch.unlock_exclusive_unchanged();
            return Err(Restart::Fail(e.into()));
        }
        if let Some(log) = w.log.as_ref().filter(|l| l.must_wait()) {
            // the log is nearly full: wait for a checkpoint holding no exclusive latch (the
            // checkpoint may need to write this page), then start over
            f.latch.unlock_exclusive_unchanged();
            log.log()
                .wait_for_room()
                .map_err(|e| Restart::Fail(e.into()))?;
            return Err(Restart::Retry);
        }
        f.set_dirty(true);
        f.touch(w.node.buffer().clock());
        w.hold();
        if let Some(log) = &w.log {
            log.open();
        }
        Ok(ExclusiveGuard {
            w,
            idx,
            pid,
            changed: Changed::default(),
        })
    }

    /// Finish a conversion to exclusive (the caller just took the exclusive latch from an
    /// optimistic or shared guard): with only node-shared possession, release the latch, ask
    /// for node-exclusive and restart the operation.
    pub(super) fn converted(
        w: &'w Worker,
        idx: FrameIdx,
        pid: Pid,
    ) -> OpResult<ExclusiveGuard<'w>> {
        let f = w.frame(idx);
        if f.possession() != Possession::Exclusive {
            f.latch.unlock_exclusive_unchanged();
            w.miss(pid, Mode::Exclusive)?;
            return Err(Restart::Retry);
        }
        ExclusiveGuard::start(w, idx, pid)
    }

    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// The page's data area as plain bytes (no writer but us, and we cannot write while this
    /// borrow lives).
    pub fn data(&self) -> &[u8] {
        // SAFETY: we hold the latch exclusively, so only this guard writes the memory, and only
        // through `&mut self`, which cannot coexist with this borrow. Concurrent optimistic
        // readers only load.
        unsafe {
            std::slice::from_raw_parts(self.w.node.buffer().page_ptr(self.idx), PAGE_DATA_SIZE)
        }
    }

    /// Read accessors.
    pub fn page(&self) -> PageRef<'_> {
        self.w.page_ref(self.idx)
    }

    /// Write accessors (atomic word stores, so optimistic readers never race non-atomically).
    pub fn page_mut(&mut self) -> PageMut<'_> {
        // SAFETY: we hold the exclusive latch: the only writer of this page; `&mut self` makes
        // the returned writer unique.
        let m = unsafe { PageMut::from_ptr(self.w.node.buffer().page_ptr(self.idx)) };
        if self.w.log.is_some() {
            m.tracking(&mut self.changed)
        } else {
            m
        }
    }

    /// Edit a private copy of the page with ordinary Rust code, then store it back. Convenient
    /// for structural changes (splits, compaction); costs a 4 KiB copy (into a buffer the
    /// worker keeps) and a compare. Only the words that differ are stored back (and logged).
    pub fn modify<T>(&mut self, f: impl FnOnce(&mut [u8; PAGE_DATA_SIZE]) -> T) -> T {
        self.modify_in(|b| (f(b), None))
    }

    /// [`ExclusiveGuard::modify`] for an edit that knows where it wrote: `f` returns, with its
    /// result, the byte ranges outside which it changed nothing (`None`: it may have changed
    /// anything). Only those ranges are compared and stored, which spares comparing the rest
    /// of the page (a B-tree insert touches the header, the slot arrays and one record).
    /// Debug builds check that nothing changed outside them.
    pub fn modify_in<T>(
        &mut self,
        f: impl FnOnce(&mut [u8; PAGE_DATA_SIZE]) -> (T, Option<[Range<usize>; 2]>),
    ) -> T {
        let mut copy = self
            .w
            .scratch
            .take()
            .unwrap_or_else(|| Box::new([0u8; PAGE_DATA_SIZE]));
        copy.copy_from_slice(self.data());
        let (r, within) = f(&mut copy);
        match within {
            None => self.store_changed_words(&copy, 0..PAGE_DATA_SIZE),
            Some(ranges) => {
                #[cfg(debug_assertions)]
                {
                    let old = self.data();
                    let inside = |i: usize| ranges.iter().any(|r| r.contains(&i));
                    let stray = (0..PAGE_DATA_SIZE).find(|&i| !inside(i) && old[i] != copy[i]);
                    assert!(
                        stray.is_none(),
                        "modify_in: byte {stray:?} changed outside {ranges:?}"
                    );
                }
                for range in ranges {
                    self.store_changed_words(&copy, range);
                }
            }
        }
        self.w.scratch.set(Some(copy));
        r
    }

    /// Write the 8-byte words of `new` that differ from the page, as runs of adjacent words.
    /// Whole 64-byte blocks are compared first (a change to a node touches a few blocks), then
    /// the words of the blocks that differ.
    fn store_changed_words(&mut self, new: &[u8; PAGE_DATA_SIZE], range: Range<usize>) {
        /// Runs remembered; past that, a new run is merged into the last one (rewriting the
        /// unchanged words between them, which is harmless).
        const MAX_RUNS: usize = 32;
        const BLOCK: usize = 64;
        const { assert!(PAGE_DATA_SIZE.is_multiple_of(8)) };
        let mut runs = [(0usize, 0usize); MAX_RUNS];
        let mut n = 0;
        {
            let old = self.data();
            let mut add = |s: usize| {
                if n > 0 && (runs[n - 1].1 == s || n == MAX_RUNS) {
                    runs[n - 1].1 = s + 8;
                } else {
                    runs[n] = (s, s + 8);
                    n += 1;
                }
            };
            // the words that hold any byte of `range`
            let lo = range.start.min(PAGE_DATA_SIZE) / 8;
            let hi = range.end.min(PAGE_DATA_SIZE).div_ceil(8).max(lo);
            let (old_words, _) = old.as_chunks::<8>();
            let (new_words, _) = new.as_chunks::<8>();
            let (old_words, new_words) = (&old_words[lo..hi], &new_words[lo..hi]);
            // compared a block of 8 words at a time: the OR of the words' XORs first (no
            // branch per word), then the words of a block that differs
            let word = |w: &[u8; 8]| u64::from_ne_bytes(*w);
            let mut old_blocks = old_words.chunks_exact(BLOCK / 8);
            let mut new_blocks = new_words.chunks_exact(BLOCK / 8);
            for (b, (o, c)) in old_blocks.by_ref().zip(new_blocks.by_ref()).enumerate() {
                let diff = o
                    .iter()
                    .zip(c)
                    .fold(0u64, |d, (x, y)| d | (word(x) ^ word(y)));
                if diff != 0 {
                    for (k, (x, y)) in o.iter().zip(c).enumerate() {
                        if x != y {
                            add((lo + b * BLOCK / 8 + k) * 8);
                        }
                    }
                }
            }
            // the words after the last whole block
            let tail = lo + old_words.len() - old_blocks.remainder().len();
            for (k, (x, y)) in old_blocks
                .remainder()
                .iter()
                .zip(new_blocks.remainder())
                .enumerate()
            {
                if x != y {
                    add((tail + k) * 8);
                }
            }
        }
        let mut m = self.page_mut();
        for &(s, e) in &runs[..n] {
            m.write(s, &new[s..e]);
        }
    }

    /// The page's stamp (see [`OptimisticGuard::stamp`]) before this guard took it: it does not
    /// change while the guard is held (the release bumps the version). Equal to an earlier
    /// stamp of the page: nothing changed in between.
    pub fn stamp(&self) -> PageStamp {
        PageStamp {
            frame: self.idx.0,
            version: self.w.frame(self.idx).latch.version_now(),
        }
    }

    /// Let the page go without bumping its version: optimistic readers that began before the
    /// guard was taken stay valid. Only for a guard that changed nothing (asserted).
    pub fn release_unchanged(self) {
        let me = ManuallyDrop::new(self);
        assert!(
            me.changed.is_empty(),
            "release_unchanged of a guard that changed its page"
        );
        match &me.w.log {
            Some(log) => log.close_unchanged(me.w.node.buffer(), me.idx),
            None => me.w.frame(me.idx).latch.unlock_exclusive_unchanged(),
        }
        me.w.unhold();
    }

    /// Become a shared guard (bumps the version: optimistic readers of the old state restart).
    /// With a log, the page's change is logged now, in a chunk of its own (not with the
    /// worker's other open guards).
    pub fn to_shared(self) -> SharedGuard<'w> {
        let mut me = ManuallyDrop::new(self);
        if let Some(log) = &me.w.log {
            let changed = std::mem::take(&mut me.changed);
            // its change alone is logged now; its latch is kept (downgraded below)
            log.demote(me.w.node.buffer(), me.idx, me.pid, changed);
        }
        me.w.frame(me.idx).latch.downgrade();
        // the exclusive guard's hold passes to the shared one
        SharedGuard {
            w: me.w,
            idx: me.idx,
            pid: me.pid,
        }
    }

    /// Delete the page. On a single node its frame and its slot are freed. A cluster node
    /// *recycles* it instead: zeroes it and keeps it for its own next [`Worker::allocate`].
    /// The page stays a live page of the coherence protocol (other nodes may hold copies or
    /// have requests for it in flight, which a real free would have to chase), so nothing
    /// changes for them: a stale reader of a copy fails validation as it would after any
    /// change. Recycled pages are not remembered across a restart: they stay allocated,
    /// zeroed and unused (`shoal inspect` counts them as in use outside every tree), except
    /// those homed on the node itself, which a clean close returns to its store's free list.
    pub fn free(mut self) -> Result<(), EngineError> {
        if self.w.node.is_cluster() {
            // recycled: zeroed as a change like any other (logged with the worker's group, its
            // version bumped), then released as any guard is
            self.page_mut().fill(0, shoal_storage::PAGE_DATA_SIZE, 0);
            let (w, pid) = (self.w, self.pid);
            drop(self);
            w.node.recycle(pid);
            return Ok(());
        }
        let me = ManuallyDrop::new(self);
        me.w.unhold();
        let node = &me.w.node;
        if let Some(log) = &me.w.log {
            // the slot goes back after the group (with the change that unlinked the page) is
            // logged; the page itself is gone now
            let slot = node
                .buffer()
                .drop_freed(node.buffer().held_by_guard(me.idx));
            log.free_later(node.buffer(), slot);
            return Ok(());
        }
        node.free_page(node.buffer().held_by_guard(me.idx))
    }
}

impl Drop for ExclusiveGuard<'_> {
    fn drop(&mut self) {
        let changed = std::mem::take(&mut self.changed);
        match &self.w.log {
            Some(log) => log.close(self.w.node.buffer(), self.idx, self.pid, changed),
            None => self.w.frame(self.idx).latch.unlock_exclusive(),
        }
        self.w.unhold();
    }
}
