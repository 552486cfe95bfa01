//! The local buffer: one node's frames and what finds, fills and empties them.
//!
//! | part | file | what |
//! |---|---|---|
//! | frames | [`frame`] | the pool of frame descriptors and page memory; [`FrameIdx`], [`FrameState`], [`Possession`] |
//! | latch | [`latch`] | the hybrid optimistic / shared / exclusive latch of a frame |
//! | page bytes | [`page`] | race-free access to a frame's page ([`PageRef`], [`PageMut`]) |
//! | translation table | [`table`] | page id -> frame index |
//! | free frames | [`free_frames`] | the frames that hold no page |
//! | held frames | [`held`] | [`HeldFrame`]: a frame latched exclusively, released on drop |
//!
//! [`Buffer`] ties them to the node's page store and its access clock: it faults pages in from
//! the store, installs new ones and drops them, and hands out free frames (waking the page
//! provider when they run low). It must not know about the coherence protocol, guards or
//! workers: it is what a single node is, and what a cluster node's protocol works over.

pub(crate) mod frame;
pub(crate) mod free_frames;
pub(crate) mod held;
pub(crate) mod latch;
pub(crate) mod mapped;
pub(crate) mod page;
pub(crate) mod table;

use crate::error::EngineError;
use crate::pid::Pid;
use crate::stats::EngineCounters;
pub(crate) use frame::{FrameIdx, FramePool, FrameState, Possession};
use free_frames::FreeFrames;
pub(crate) use held::HeldFrame;
use latch::Backoff;
use parking_lot::{Condvar, Mutex};
use shoal_storage::{PageStore, ReadRequest, PAGE_DATA_SIZE};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use table::TranslationTable;

/// One node's frames, translation table, free frames and page store.
pub(crate) struct Buffer {
    /// The node whose pages this buffer's store holds.
    pub node: u8,
    pool: FramePool,
    table: TranslationTable,
    store: PageStore,
    pub free: FreeFrames,
    /// The access clock: every access stamps its frame with the current value (see
    /// [`frame::Frame::touch`]); the provider advances it as pages cycle through the cache,
    /// and evicts frames whose stamp is old (epoch LRU). Not the protocol's conflict epoch.
    clock: AtomicU32,
    /// The provider keeps at least this many frames free.
    pub free_target: usize,
    /// How long a fault waits for a free frame before failing.
    free_frame_timeout: Duration,
    shutdown: AtomicBool,
    provider_wake: Condvar,
    provider_mx: Mutex<()>,
    frames_freed: Condvar,
    frames_mx: Mutex<()>,
    /// Last error the provider hit (reported by faults that starve).
    pub provider_error: Mutex<Option<String>>,
    /// Flushes asked for by `Engine::flush`, served by the provider.
    pub flushes: Flushes,
    pub counters: EngineCounters,
}

/// Flushes asked for ([`crate::Engine::flush`]) and served (by the provider thread, the only
/// thread that writes pages back while the engine runs): tickets in order, one condition
/// variable for the askers.
#[derive(Default)]
pub struct Flushes {
    state: Mutex<FlushState>,
    served: Condvar,
}

#[derive(Default)]
struct FlushState {
    asked: u64,
    served: u64,
    /// The ticket of the last failed flush and why.
    failed: Option<(u64, String)>,
}

impl Flushes {
    /// Ask for a flush; returns its ticket.
    fn ask(&self) -> u64 {
        let mut s = self.state.lock();
        s.asked += 1;
        s.asked
    }

    /// The newest ticket not served yet.
    pub fn pending(&self) -> Option<u64> {
        let s = self.state.lock();
        (s.asked > s.served).then_some(s.asked)
    }

    /// Every ticket up to `upto` is served, with `result`.
    pub fn served(&self, upto: u64, result: Result<(), String>) {
        let mut s = self.state.lock();
        debug_assert!(upto >= s.served, "tickets are served in order");
        s.served = s.served.max(upto);
        if let Err(why) = result {
            s.failed = Some((upto, why));
        }
        self.served.notify_all();
    }
}

impl Buffer {
    /// A buffer of `frames` frames over `store`.
    pub fn new(
        node: u8,
        store: PageStore,
        table: TranslationTable,
        frames: usize,
        free_target_percent: u32,
        free_frame_timeout: Duration,
    ) -> Result<Buffer, EngineError> {
        let pool = FramePool::new(frames).map_err(|e| EngineError::Resources {
            what: format!("{frames} frames of page memory"),
            source: Arc::new(e),
        })?;
        Ok(Buffer {
            node,
            pool,
            table,
            store,
            free: FreeFrames::all(frames),
            clock: AtomicU32::new(1),
            free_target: (frames * free_target_percent as usize / 100).max(16),
            free_frame_timeout,
            shutdown: AtomicBool::new(false),
            provider_wake: Condvar::new(),
            provider_mx: Mutex::new(()),
            frames_freed: Condvar::new(),
            frames_mx: Mutex::new(()),
            provider_error: Mutex::new(None),
            flushes: Flushes::default(),
            counters: EngineCounters::default(),
        })
    }

    /// The descriptor of frame `idx`.
    #[inline]
    pub fn frame(&self, idx: FrameIdx) -> &frame::Frame {
        self.pool.frame(idx)
    }

    /// Where frame `idx`'s page bytes live (for the page accessors and copies under a latch).
    #[inline]
    pub fn page_ptr(&self, idx: FrameIdx) -> *mut u8 {
        self.pool.page_ptr(idx)
    }

    /// Frames in the pool.
    pub fn frames(&self) -> usize {
        self.pool.len()
    }

    /// Every frame's index.
    pub fn frame_indexes(&self) -> impl Iterator<Item = FrameIdx> {
        self.pool.indexes()
    }

    /// The node's page store.
    pub fn store(&self) -> &PageStore {
        &self.store
    }

    /// `pid`'s preferred frame (see [`FramePool::preferred`]).
    #[cfg(test)]
    pub fn preferred(&self, pid: Pid) -> FrameIdx {
        self.pool.preferred(pid)
    }

    /// The frame that probably holds `pid` (every caller checks the frame's pid again under
    /// its latch), or `None` if it is not resident. First its preferred frame: if that frame
    /// says it holds `pid`, the translation entry is not needed at all, so the frame
    /// descriptor and the page's first lines are the only cache misses, and they overlap.
    /// Else the translation table.
    #[inline]
    pub fn locate(&self, pid: Pid) -> Option<FrameIdx> {
        let preferred = self.pool.preferred(pid);
        self.pool.prefetch_page(preferred);
        if self.pool.frame(preferred).pid() == pid {
            return Some(preferred);
        }
        self.table.lookup(&self.pool, pid)
    }

    /// Hint: start loading `pid`'s translation entry.
    #[inline]
    pub fn prefetch_entry(&self, pid: Pid) {
        self.table.prefetch(pid);
    }

    /// Hint: bytes `off..off + len` of `pid`'s page, in its preferred frame.
    #[inline]
    pub fn prefetch_range(&self, pid: Pid, off: usize, len: usize) {
        self.pool.prefetch_range(self.pool.preferred(pid), off, len);
    }

    /// Hint: `pid`'s frame descriptor and first page lines, once its entry is cached; whether
    /// it is resident (a hint).
    #[inline]
    pub fn prefetch_frame(&self, pid: Pid) -> bool {
        self.table.prefetch_frame(&self.pool, pid)
    }

    /// The access clock's value now (read-mostly: one relaxed load).
    #[inline]
    pub fn clock(&self) -> u32 {
        self.clock.load(Ordering::Relaxed)
    }

    /// Advance the access clock (the provider, as pages cycle through the cache).
    pub fn tick_clock(&self) {
        // Relaxed: the clock is a recency hint, never used to order memory.
        self.clock.fetch_add(1, Ordering::Relaxed);
    }

    pub fn is_shutdown(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// Stop handing out frames for new work and wake the provider so that it sees the stop.
    pub fn shut_down(&self) {
        self.shutdown.store(true, Ordering::Release);
        let _g = self.provider_mx.lock();
        self.provider_wake.notify_all();
    }

    /// The provider's wait between rounds: until a taker wakes it, `timeout` passes or the
    /// buffer shuts down; returns at once while fewer than `free_target` frames are free.
    pub fn wait_for_demand(&self, timeout: Duration) {
        let mut g = self.provider_mx.lock();
        // (a flush asked for is noticed here or wakes the wait: `flush` notifies under the
        // same mutex after asking)
        if !self.is_shutdown()
            && self.free.len() >= self.free_target
            && self.flushes.pending().is_none()
        {
            self.provider_wake.wait_for(&mut g, timeout);
        }
    }

    /// Ask the provider to write back every page dirty now and wait until it has (see
    /// [`crate::Engine::flush`]). Fails if the flush failed or the buffer shut down first.
    pub fn flush(&self) -> Result<(), EngineError> {
        if self.is_shutdown() {
            return Err(EngineError::Shutdown);
        }
        let ticket = self.flushes.ask();
        {
            let _g = self.provider_mx.lock();
            self.provider_wake.notify_all();
        }
        let mut s = self.flushes.state.lock();
        while s.served < ticket {
            if self.is_shutdown() {
                return Err(EngineError::Shutdown);
            }
            self.flushes
                .served
                .wait_for(&mut s, Duration::from_millis(100));
        }
        match &s.failed {
            Some((t, why)) if *t >= ticket => Err(EngineError::FlushFailed(why.clone())),
            _ => Ok(()),
        }
    }

    /// The provider freed frames: wake faults that wait for one.
    pub fn frames_were_freed(&self) {
        let _g = self.frames_mx.lock();
        self.frames_freed.notify_all();
    }

    /// Take a frame for `pid` that is free right now, if any: its preferred frame if that is free
    /// (see [`FramePool::preferred`]), else any. Wakes the provider when free frames run low (or out).
    pub fn try_take_free_frame(&self, pid: Pid) -> Option<FrameIdx> {
        let preferred = self.pool.preferred(pid);
        let i = if self.free.take(preferred) {
            Some(preferred)
        } else {
            self.free.take_any()
        };
        if i.is_none() || self.free.len() < self.free_target {
            self.provider_wake.notify_one();
        }
        i
    }

    /// Take a free frame for `pid`, waking the provider and waiting for it if none is free.
    pub fn take_free_frame(&self, pid: Pid) -> Result<FrameIdx, EngineError> {
        let mut started: Option<Instant> = None;
        loop {
            if let Some(i) = self.try_take_free_frame(pid) {
                return Ok(i);
            }
            if self.is_shutdown() {
                return Err(EngineError::Shutdown);
            }
            let t0 = *started.get_or_insert_with(Instant::now);
            if t0.elapsed() > self.free_frame_timeout {
                let why = self.provider_error.lock().clone().unwrap_or_else(|| {
                    format!(
                        "all {} frames are in use and none could be evicted (too many pages fixed by guards?)",
                        self.pool.len()
                    )
                });
                return Err(EngineError::NoFreeFrame {
                    waited_ms: t0.elapsed().as_millis() as u64,
                    why,
                });
            }
            if crate::tasks::pause(crate::tasks::Wait::Idle) {
                continue; // a task: the thread's other tasks ran meanwhile
            }
            let mut g = self.frames_mx.lock();
            if self.free.is_empty() {
                self.frames_freed.wait_for(&mut g, Duration::from_millis(1));
            }
        }
    }

    /// Give a frame (unlatched, free, unlinked) back to the free frames.
    pub fn release_frame(&self, idx: FrameIdx) {
        debug_assert_eq!(self.pool.frame(idx).state(), FrameState::Free);
        self.free.put(idx);
    }

    /// The frame the table maps `pid` to, under the partition lock (exact, not a hint; the
    /// frame may still change once the lock is gone).
    pub fn resident_frame(&self, pid: Pid) -> Option<FrameIdx> {
        let part = self.table.lock(pid);
        self.table.lookup_locked(&part, pid)
    }

    /// Load `pid` from the store into a frame (or find that another thread did). Returns the
    /// frame index; the caller re-checks the frame under its latch, since it may be evicted
    /// again at once. For pages homed here and allocated ([`Buffer::check_faultable`]).
    pub fn fault(&self, pid: Pid) -> Result<FrameIdx, EngineError> {
        self.check_faultable(pid)?;
        let idx = self.take_free_frame(pid)?;
        let h = match self.claim_for_load(pid, idx) {
            Ok(h) => h,
            Err(found) => return Ok(found),
        };
        // SAFETY: the frame's page memory is valid and aligned; we hold its exclusive latch, so
        // no Rust code writes it until we release. Stale optimistic readers may load from it
        // while the kernel fills it; their validation fails because the release bumps the
        // version.
        let r = unsafe { self.store.read_into(pid.slot(), pid.raw(), h.page_ptr()) };
        self.finish_load(h, r)?;
        Ok(idx)
    }

    /// Load the pages among `pids` that are not resident with one batch of reads, all in flight
    /// together. Pages resident or being loaded already are skipped; when no frame is free, the
    /// remaining pages are left alone (they fault one by one when latched). Returns how many
    /// pages it read; the first failed read is the error (every page is handled either way).
    pub fn fault_many(&self, pids: &[Pid]) -> Result<usize, EngineError> {
        for &pid in pids {
            self.check_faultable(pid)?;
        }
        let mut claimed = Vec::with_capacity(pids.len());
        for &pid in pids {
            let Some(idx) = self.try_take_free_frame(pid) else {
                break;
            };
            if let Ok(h) = self.claim_for_load(pid, idx) {
                claimed.push(h);
            }
        }
        let reqs: Vec<ReadRequest> = claimed
            .iter()
            .map(|h| ReadRequest {
                slot: h.pid().slot(),
                pid: h.pid().raw(),
                dst: h.page_ptr(),
            })
            .collect();
        // SAFETY: as in `fault`, for each request: we hold its frame's exclusive latch, and the
        // frames (so the destinations) are distinct.
        let results = unsafe { self.store.read_batch(&reqs) };
        let mut out = Ok(claimed.len());
        for (h, r) in claimed.into_iter().zip(results) {
            if let Err(e) = self.finish_load(h, r) {
                if out.is_ok() {
                    out = Err(e);
                }
            }
        }
        out
    }

    /// Whether this buffer may fault `pid` from its store: homed here and allocated.
    fn check_faultable(&self, pid: Pid) -> Result<(), EngineError> {
        if pid.node() != self.node {
            return Err(EngineError::RemotePage {
                pid,
                home: pid.node(),
                node: self.node,
            });
        }
        if pid.slot() >= self.store.high_water() {
            return Err(EngineError::NoSuchPage { pid });
        }
        Ok(())
    }

    /// Start loading `pid` into the free frame `idx`: latch it, mark it loading and enter it in
    /// the table. If `pid` is in the table already, `idx` goes back to the free frames and
    /// the error is the frame that has it.
    fn claim_for_load(&self, pid: Pid, idx: FrameIdx) -> Result<HeldFrame<'_>, FrameIdx> {
        let part = self.table.lock(pid);
        if let Some(found) = self.table.lookup_locked(&part, pid) {
            drop(part);
            self.release_frame(idx);
            return Err(found);
        }
        let h = self.hold_free(idx);
        h.frame().set_pid(pid);
        h.frame().set_state(FrameState::Loading);
        h.frame().set_dirty(false);
        self.table.insert(&self.pool, &part, idx);
        Ok(h)
    }

    /// The read of a claimed frame finished with `r`: make the page resident, or drop the
    /// frame and report the error.
    fn finish_load(
        &self,
        h: HeldFrame<'_>,
        r: shoal_storage::StoreResult<()>,
    ) -> Result<(), EngineError> {
        match r {
            Ok(()) => {
                let f = h.frame();
                f.set_state(FrameState::Resident);
                f.set_possession(Possession::Exclusive);
                f.touch(self.clock());
                Ok(())
            }
            Err(e) => {
                let pid = h.pid();
                h.drop_page();
                Err(EngineError::PageRead {
                    pid,
                    source: Arc::new(e),
                })
            }
        }
    }

    /// Put a brand-new, zeroed page `pid` into a frame, held exclusively by the caller, dirty,
    /// with possession `possession`.
    pub fn install_new_page(
        &self,
        pid: Pid,
        possession: Possession,
    ) -> Result<HeldFrame<'_>, EngineError> {
        let fresh = self.take_free_frame(pid)?;
        // A freed slot's old page can still be resident, if some thread faulted it in through
        // a stale pointer after the free. That copy must not survive next to the new page (a
        // later write-back of it would overwrite the new page's slot): take over its frame.
        // Its latch is only tried under the partition lock (a provider dropping that frame
        // holds its latch and then takes the partition lock): let go and retry.
        let mut b = Backoff::new();
        let (mut h, part) = loop {
            let part = self.table.lock(pid);
            match self.table.lookup_locked(&part, pid) {
                None => break (self.hold_free(fresh), part),
                Some(stale) => {
                    if let Some(h) = self.try_hold_any(stale) {
                        self.release_frame(fresh);
                        break (h, part);
                    }
                }
            }
            drop(part);
            b.snooze();
        };
        let f = h.frame();
        f.set_pid(pid);
        f.set_state(FrameState::Resident);
        f.set_dirty(true);
        f.set_possession(possession);
        h.page_mut().fill(0, PAGE_DATA_SIZE, 0);
        h.set_version(0); // (not the frame's previous page's)
        self.table.insert(&self.pool, &part, h.idx());
        drop(part);
        f.touch(self.clock());
        Ok(h)
    }

    /// A free frame for `pid` that is free right now, held, resident with possession none, in
    /// the table (its bytes are whatever the frame held before). `None` when no frame is free.
    pub fn take_frame_for(&self, pid: Pid) -> Option<HeldFrame<'_>> {
        let idx = self.try_take_free_frame(pid)?;
        let h = self.hold_free(idx);
        let f = h.frame();
        f.set_pid(pid);
        f.set_state(FrameState::Resident);
        f.set_dirty(false);
        f.set_possession(Possession::None);
        let part = self.table.lock(pid);
        self.table.insert(&self.pool, &part, idx);
        Some(h)
    }

    /// Drop page `pid`'s frame if it is resident here (waiting for a latch holder to leave:
    /// the provider writing it back, a stale reader) and return its slot to the allocator. For
    /// a page homed here that nothing can reach any more.
    pub fn discard_page(&self, pid: Pid) -> Result<(), EngineError> {
        let mut b = Backoff::new();
        while let Some(idx) = self.table.lookup(&self.pool, pid) {
            match self.try_hold(idx, pid) {
                Some(h) => {
                    h.drop_page();
                    break;
                }
                None if self.pool.frame(idx).pid() == pid => b.snooze(),
                None => {} // the entry moved on meanwhile: look again
            }
        }
        // As in `free_page`: the provider issues writes one batch at a time, so a write-back of
        // this page completes before a write of the slot's next page is issued.
        self.store.free(pid.slot())?;
        Ok(())
    }

    /// Drop page `h` holds and return its slot, which the caller gives back to the allocator
    /// later (after the change that unlinked the page is logged).
    pub fn drop_freed(&self, h: HeldFrame<'_>) -> u64 {
        let pid = h.pid();
        debug_assert_eq!(pid.node(), self.node, "only pages homed here are freed");
        h.drop_page();
        pid.slot()
    }

    /// Drop page `h` holds and return its slot to the allocator.
    pub fn free_page(&self, h: HeldFrame<'_>) -> Result<(), EngineError> {
        let pid = h.pid();
        debug_assert_eq!(pid.node(), self.node, "only pages homed here are freed");
        h.drop_page();
        // The provider is the only writer of pages and issues its writes one batch at a time, so
        // any write of the old page completes before a write of the slot's next owner is issued.
        self.store.free(pid.slot())?;
        Ok(())
    }
}
