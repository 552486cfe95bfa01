//! [`WorkerLog`]: a worker's part of the write-ahead log: its open *log group*.
//!
//! The exclusive guards a worker holds at once (a split's parent and children, a merge's
//! three nodes) are logged as one chunk, which recovery replays whole or not at all. A guard
//! that changed its page and is dropped while others are still held keeps its latch until the
//! group is logged: no other writer's change to the page can enter the log before this one
//! (log order is each page's change order). Rule: while a worker holds an exclusive guard it
//! must not latch a page it changed and dropped in the same group (it would wait for itself;
//! debug builds panic).

use super::log::Log;
use super::CommitPoint;
use crate::buffer::page::Changed;
use crate::buffer::{Buffer, FrameIdx};
use crate::error::EngineError;
use crate::pid::Pid;
use shoal_storage::wal::{put_diff, put_image};
use shoal_storage::{PAGE_DATA_SIZE, VERSION_OFF};
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The open group: what the worker's exclusive guards changed, not logged yet.
#[derive(Default)]
struct LogGroup {
    /// Exclusive guards held now.
    open: u32,
    /// Changed pages whose guards were dropped, latches still held.
    pages: Vec<(FrameIdx, Pid, Changed)>,
    /// Slots of pages freed in the group: given back after the group is logged (a slot must
    /// not be reused before the change that unlinked its page is in the log).
    frees: Vec<u64>,
    /// The worker's own log buffer (a chunk is encoded here, then copied into the ring).
    buf: Vec<u8>,
    /// Logging a group failed: the error `commit` reports.
    failed: Option<EngineError>,
}

/// A worker's log group (one per worker of a node with a log).
pub(crate) struct WorkerLog {
    log: Arc<Log>,
    group: RefCell<LogGroup>,
}

impl WorkerLog {
    pub fn new(log: Arc<Log>) -> WorkerLog {
        WorkerLog {
            log,
            group: RefCell::new(LogGroup::default()),
        }
    }

    pub fn log(&self) -> &Log {
        &self.log
    }

    // ------------------------------------------------------------------ the group

    /// A new group would begin while the log is nearly full (see `Log::tight`): the caller
    /// waits for room holding no exclusive latch ([`Log::wait_for_room`]).
    pub fn must_wait(&self) -> bool {
        let g = self.group.borrow();
        g.open == 0 && g.pages.is_empty() && self.log.tight()
    }

    /// An exclusive guard begins.
    pub fn open(&self) {
        self.group.borrow_mut().open += 1;
    }

    /// An exclusive guard on `idx` ends with `changed`: unlock it now (unchanged), or keep it
    /// latched until its group is logged.
    pub fn close(&self, buf: &Buffer, idx: FrameIdx, pid: Pid, changed: Changed) {
        let mut g = self.group.borrow_mut();
        assert!(g.open > 0, "an exclusive guard closed that was not open");
        g.open -= 1;
        if changed.is_empty() {
            buf.frame(idx).latch.unlock_exclusive();
        } else {
            g.pages.push((idx, pid, changed));
        }
        if g.open == 0 {
            self.publish(buf, &mut g, None);
        }
    }

    /// An exclusive guard on `idx` that changed nothing ends: its latch is let go at once
    /// without a version bump.
    pub fn close_unchanged(&self, buf: &Buffer, idx: FrameIdx) {
        let mut g = self.group.borrow_mut();
        assert!(g.open > 0, "an exclusive guard closed that was not open");
        g.open -= 1;
        buf.frame(idx).latch.unlock_exclusive_unchanged();
        if g.open == 0 {
            self.publish(buf, &mut g, None);
        }
    }

    /// An exclusive guard on `idx` becomes a shared one: its change (if any) is logged now,
    /// in a chunk of its own (not with the worker's other open guards), keeping its latch for
    /// the caller to downgrade.
    pub fn demote(&self, buf: &Buffer, idx: FrameIdx, pid: Pid, changed: Changed) {
        let mut g = self.group.borrow_mut();
        assert!(g.open > 0, "an exclusive guard demoted that was not open");
        g.open -= 1;
        if !changed.is_empty() {
            let held = std::mem::take(&mut g.pages);
            g.pages.push((idx, pid, changed));
            self.publish(buf, &mut g, Some(idx));
            g.pages = held;
        }
    }

    /// An exclusive guard freed its page, whose slot is `slot`: the slot goes back after the
    /// group (with the change that unlinked the page) is logged.
    pub fn free_later(&self, buf: &Buffer, slot: u64) {
        let mut g = self.group.borrow_mut();
        assert!(g.open > 0, "a page freed by a guard that was not open");
        g.frees.push(slot);
        g.open -= 1;
        if g.open == 0 {
            self.publish(buf, &mut g, None);
        }
    }

    /// Debug check of the group rule: `idx` is not latched by this worker's open group.
    pub fn check_not_deferred(&self, idx: FrameIdx) {
        if cfg!(debug_assertions) {
            assert!(
                !self.group.borrow().pages.iter().any(|p| p.0 == idx),
                "a worker latched a page it changed earlier in the same log group (it would wait for itself)"
            );
        }
    }

    /// Log the group (latches still held), then release its latches (but `keep`'s) and its
    /// freed slots.
    fn publish(&self, buf: &Buffer, g: &mut LogGroup, keep: Option<FrameIdx>) {
        if g.pages.is_empty() && g.frees.is_empty() {
            return;
        }
        let LogGroup {
            pages, buf: lbuf, ..
        } = g;
        let mut images = 0u64;
        let result = if pages.is_empty() {
            Ok((0, 0))
        } else {
            self.log.append(lbuf, |c, b| {
                images = 0;
                for (idx, pid, changed) in pages.iter() {
                    // SAFETY: this worker holds frame `idx`'s exclusive latch (kept for the
                    // group), so nobody else reads the version or writes the page meanwhile.
                    let version = unsafe { bump_version(buf.page_ptr(*idx)) };
                    // SAFETY: as above: nobody writes the page while we read it.
                    let data =
                        unsafe { std::slice::from_raw_parts(buf.page_ptr(*idx), PAGE_DATA_SIZE) };
                    // a page whose last logged change precedes the latest checkpoint's start
                    // (or was never logged here) goes in whole: recovery from that checkpoint
                    // needs no page from the store
                    if buf.frame(*idx).lsn() <= c {
                        images += 1;
                        put_image(b, pid.slot(), pid.raw(), version, data);
                    } else {
                        put_diff(b, pid.slot(), pid.raw(), version, changed.ranges(), data);
                    }
                }
            })
        };
        if images > 0 {
            self.log.stats.images.fetch_add(images, Ordering::Relaxed);
        }
        let end = match result {
            Ok((_, end)) => end,
            Err(e) => {
                log::error!(
                    "node {}: logging a change failed: {e}; the log takes no more changes",
                    buf.node
                );
                // the pages hold changes the log does not: a later change of them must not
                // reach the log either (recovery would apply it over a page without this one)
                self.log.fail();
                g.failed.get_or_insert(e.into());
                // never written back: the write-ahead rule cannot be met for these pages
                u64::MAX
            }
        };
        for (idx, _, _) in g.pages.drain(..) {
            let f = buf.frame(idx);
            if end != 0 {
                f.set_lsn(end);
            }
            if Some(idx) != keep {
                f.latch.unlock_exclusive();
            }
        }
        for slot in g.frees.drain(..) {
            if let Err(e) = buf.store().free(slot) {
                log::warn!("node {}: giving back slot {slot}: {e}", buf.node);
            }
        }
    }

    // ------------------------------------------------------------------ commits

    /// The point in the log that must be durable before the caller may say the work is done:
    /// the log's tail now, which covers everything this worker changed and everything it could
    /// have read (a change is in the log before its page is unlatched).
    pub fn commit_later(&self) -> Result<CommitPoint, EngineError> {
        let mut g = self.group.borrow_mut();
        debug_assert_eq!(g.open, 0, "commit while holding an exclusive guard");
        if let Some(e) = g.failed.take() {
            return Err(e);
        }
        self.log.stats.commits.fetch_add(1, Ordering::Relaxed);
        Ok(CommitPoint(self.log.tail()))
    }

    /// Whether everything before `point` is durable (an error if the log failed: then it
    /// never will be).
    pub fn is_durable(&self, point: CommitPoint) -> Result<bool, EngineError> {
        if point == CommitPoint::NOW || self.log.durable() >= point.0 {
            return Ok(true);
        }
        self.log.check_failed()?;
        Ok(false)
    }

    /// Wait until everything before `point` is durable (flushing it if nobody else is).
    pub fn wait_durable(&self, point: CommitPoint) -> Result<(), EngineError> {
        if point == CommitPoint::NOW {
            return Ok(());
        }
        // A task lets the thread's other tasks run while the log writer flushes (under
        // `commit` it flushes one batch after another; under `flush-every-ms`, on its tick).
        while crate::tasks::may_pause() {
            if self.is_durable(point)? {
                return Ok(());
            }
            crate::tasks::pause(crate::tasks::Wait::Idle);
        }
        Ok(self.log.flush_to(point.0)?)
    }
}

/// Count one more logged change of the page at `page` and return its new version (the page's
/// version lives in its own bytes, after the data area: it travels with the page between
/// nodes and into the store; storage/src/page.rs).
///
/// # Safety
/// `page` points to a frame's [`shoal_storage::PAGE_SIZE`] bytes, and the caller holds the
/// frame's exclusive latch (no other thread reads or writes the version meanwhile).
unsafe fn bump_version(page: *mut u8) -> u64 {
    // SAFETY: per the contract, the 8 bytes at VERSION_OFF are inside the frame and ours.
    let at = unsafe { page.add(VERSION_OFF) };
    let mut b = [0u8; 8];
    // SAFETY: as above (unaligned-safe byte copies).
    unsafe { std::ptr::copy_nonoverlapping(at, b.as_mut_ptr(), 8) };
    // (2^64 changes of one page cannot happen; a version that large came from a damaged
    // page or a faulty peer: it stays there rather than wrap back below older records)
    let v = u64::from_le_bytes(b).saturating_add(1);
    // SAFETY: as above.
    unsafe { std::ptr::copy_nonoverlapping(v.to_le_bytes().as_ptr(), at, 8) };
    v
}
