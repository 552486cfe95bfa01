//! Handing out and taking back slots: each allocation reserves its device room first and is
//! recorded in the log (if the store has one) under the allocator's lock.

use super::*;

impl PageStore {
    /// Allocate a page slot, with room for it on its device: a slot is handed out only once
    /// the device space it will be written to is reserved (`fallocate`), so a full device
    /// refuses the allocation ([`StoreError::NoRoom`]) instead of failing a later write-back of
    /// a page that then cannot leave memory. On file systems without `fallocate` (ext2, some
    /// network and FUSE file systems) the room is reserved by writing zero pages, a
    /// [`WRITE_CHUNK`] at a time, with the same guarantee.
    pub fn allocate(&self) -> StoreResult<u64> {
        self.allocate_noting_reuse().map(|(s, _)| s)
    }

    /// Allocate a slot for page `pid_of(slot)` and give the version its new page starts
    /// from: a slot used before continues the versions of the page it held (read from the
    /// store; 0 if unreadable), so that no record of the old page in any node's log can pass
    /// for a newer state of the new one (docs/durability.md, "Clusters").
    pub fn allocate_versioned(&self, pid_of: impl Fn(u64) -> u64) -> StoreResult<(u64, u64)> {
        let (slot, reused) = self.allocate_noting_reuse()?;
        if !reused {
            return Ok((slot, 0));
        }
        let mut old = crate::page::AlignedPage::new();
        // SAFETY: `old` is our own aligned page buffer, written only by this read.
        let version = match unsafe { self.read_into(slot, pid_of(slot), old.as_mut_ptr()) } {
            Ok(()) => crate::page::version(&old),
            // a free-list chain page, or never written back: no log holds records of it (the
            // free list is written at a clean close, after which every log is checkpointed)
            Err(_) => 0,
        };
        Ok((slot, version))
    }

    fn allocate_noting_reuse(&self) -> StoreResult<(u64, bool)> {
        // The allocator's lock is held while space is reserved so that a refused slot can be
        // taken back exactly (the next fresh slot again, not a free-list entry: free slots
        // hold the free-list chain at shutdown and must have room).
        let mut alloc = self.alloc.lock();
        let (slot, reused) = alloc.allocate_noting_reuse()?;
        if let Err(e) = self.ensure_space(slot) {
            alloc.unallocate(slot);
            return Err(e);
        }
        if let Err(e) = self.record(SlotChange::Allocated(slot)) {
            alloc.unallocate(slot);
            return Err(e);
        }
        Ok((slot, reused))
    }

    /// Reserve the device range holding `slot` if it lies beyond what was reserved, a
    /// [`GROW_CHUNK`] at a time (just what `slot` needs when a whole chunk does not fit).
    /// Caller holds the allocator's lock.
    pub(super) fn ensure_space(&self, slot: u64) -> StoreResult<()> {
        let (dev, off) = self.slot_location(slot);
        let d = &self.devices[dev];
        let end = off + PAGE_SIZE as u64;
        // Acquire/Release on `extent`: only allocations (serialised by the allocator's lock)
        // read and write it; the orderings just keep that true if a reader outside the lock
        // is ever added.
        let have = d.extent.load(Ordering::Acquire);
        if !d.regular || end <= have {
            return Ok(());
        }
        let step = if d.by_writing.load(Ordering::Relaxed) {
            WRITE_CHUNK
        } else {
            GROW_CHUNK
        };
        let chunk = end.div_ceil(step) * step;
        let mut last = None;
        for target in [chunk, end] {
            match reserve_range(d, have, target) {
                Ok(()) => {
                    d.extent.store(target, Ordering::Release);
                    return Ok(());
                }
                Err(e) if is_full(&e) => last = Some(e),
                Err(e) => return Err(io_err(&d.path, e)),
            }
        }
        Err(StoreError::NoRoom {
            path: d.path.clone(),
            slot,
            source: last.unwrap_or_else(|| std::io::Error::from_raw_os_error(libc::ENOSPC)),
        })
    }

    /// Take slot `slot`, which must be the next fresh one (well-known pages at format time).
    pub fn reserve(&self, slot: u64) -> StoreResult<()> {
        self.alloc.lock().reserve_next(slot)
    }

    /// Return a slot to the allocator.
    pub fn free(&self, slot: u64) -> StoreResult<()> {
        let mut alloc = self.alloc.lock();
        alloc.free(slot)?;
        self.record(SlotChange::Freed(slot))
    }

    /// Record an allocator change in the slot log (caller holds the allocator's lock: log
    /// order is allocation order). A store without a log records nothing.
    pub(super) fn record(&self, change: SlotChange) -> StoreResult<()> {
        match &self.slot_log {
            Some(l) => l.record(change),
            None => {
                assert!(
                    !self.logged,
                    "a store opened with a log changed its allocator before the engine attached \
                     its slot log"
                );
                Ok(())
            }
        }
    }

    /// Slots allocated at least once (the high-water mark).
    pub fn high_water(&self) -> u64 {
        self.alloc.lock().next_slot()
    }

    /// Slots currently in use.
    pub fn slots_in_use(&self) -> u64 {
        self.alloc.lock().in_use()
    }
}
