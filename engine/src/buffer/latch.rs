//! The hybrid latch: a version word that supports optimistic, shared and exclusive modes.
//!
//! One `AtomicU64` per frame:
//!
//! ```text
//! bits 63..56  state: 0 = unlocked, 1..=MAX_SHARED = number of shared holders, 0xFF = exclusive
//! bits 55..0   version: bumped when an exclusive holder releases after changing the page
//! ```
//!
//! **Optimistic** readers load the word (Acquire), read page data with relaxed atomic loads, then
//! [`HybridLatch::validate`]: an Acquire fence followed by a reload; if the version changed or an
//! exclusive holder is present, what they read may be garbage and they restart. No shared cache
//! line is written. This is the sequence-lock protocol; the reasoning for its orderings:
//!
//! - An exclusive acquirer CASes the state to exclusive (Acquire) and then issues a **Release
//!   fence** before touching data. If an optimistic reader's relaxed load observes any data store
//!   made after that fence, the reader's Acquire fence synchronises with the writer's Release
//!   fence, so the reader's subsequent reload of the word sees the exclusive state (or a later
//!   version) and validation fails.
//! - The exclusive release stores the new version with **Release**; a reader whose initial
//!   Acquire load sees that version also sees every data store of the critical section.
//!
//! **Shared** holders increment the count (Acquire on success, Release on release); they do not
//! change the version, so optimistic readers run alongside them. **Exclusive** needs the state to
//! be 0.
//!
//! Page data itself is only ever accessed through atomics (see [`crate::buffer::page`]), so a reader
//! racing with a writer is never a data race in Rust's memory model: it reads stale or mixed
//! values, which validation then rejects.

// Under `--cfg loom` the latch runs on loom's atomics, so the loom tests below explore every
// interleaving (and every value a relaxed load may return) of the protocol as written here.
#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicU64, Ordering};

const STATE_SHIFT: u32 = 56;
const VERSION_MASK: u64 = (1 << STATE_SHIFT) - 1;
const EXCLUSIVE: u64 = 0xFF;
/// Most simultaneous shared holders of one latch.
pub const MAX_SHARED: u64 = 0xFE;
const ONE_SHARED: u64 = 1 << STATE_SHIFT;

/// A hybrid optimistic / shared / exclusive latch.
#[derive(Debug)]
pub struct HybridLatch {
    word: AtomicU64,
}

#[inline]
fn state(w: u64) -> u64 {
    w >> STATE_SHIFT
}
#[inline]
fn version(w: u64) -> u64 {
    w & VERSION_MASK
}

impl HybridLatch {
    pub fn new() -> Self {
        HybridLatch {
            word: AtomicU64::new(0),
        }
    }

    /// Start an optimistic read: the current version, or `None` while an exclusive holder is in.
    #[inline]
    pub fn optimistic_begin(&self) -> Option<u64> {
        // Acquire: pairs with the Release of `unlock_exclusive`, so data written in the previous
        // exclusive section is visible to the reads that follow.
        let w = self.word.load(Ordering::Acquire);
        (state(w) != EXCLUSIVE).then_some(version(w))
    }

    /// Whether nothing changed since `optimistic_begin` returned `v`.
    #[inline]
    pub fn validate(&self, v: u64) -> bool {
        // Acquire fence: orders the caller's preceding relaxed data loads before the reload below
        // (see module docs for the pairing with the writer's Release fence).
        fence(Ordering::Acquire);
        let w = self.word.load(Ordering::Relaxed);
        state(w) != EXCLUSIVE && version(w) == v
    }

    /// The version now (for an exclusive holder: the version its section will bump; it does
    /// not change while the latch is held).
    #[inline]
    pub fn version_now(&self) -> u64 {
        version(self.word.load(Ordering::Acquire))
    }

    /// Whether any shared or exclusive holder is present (racy snapshot).
    pub fn is_latched(&self) -> bool {
        state(self.word.load(Ordering::Relaxed)) != 0
    }

    /// Whether an exclusive holder is present (racy snapshot).
    pub fn is_exclusive(&self) -> bool {
        state(self.word.load(Ordering::Relaxed)) == EXCLUSIVE
    }

    /// Try to join as a shared holder, optionally only if the version is still `expect`.
    #[inline]
    pub fn try_lock_shared(&self, expect: Option<u64>) -> bool {
        let w = self.word.load(Ordering::Relaxed);
        let s = state(w);
        if s == EXCLUSIVE || s >= MAX_SHARED || expect.is_some_and(|v| v != version(w)) {
            return false;
        }
        // Acquire on success: the holder must see the last exclusive section's data.
        self.word
            .compare_exchange(w, w + ONE_SHARED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Leave as a shared holder.
    #[inline]
    pub fn unlock_shared(&self) {
        // Release: our reads happen before a later exclusive holder's writes.
        let prev = self.word.fetch_sub(ONE_SHARED, Ordering::Release);
        debug_assert!(
            state(prev) >= 1 && state(prev) != EXCLUSIVE,
            "unlock_shared on {prev:#x}"
        );
    }

    /// Try to become the exclusive holder, optionally only if the version is still `expect`.
    #[inline]
    pub fn try_lock_exclusive(&self, expect: Option<u64>) -> bool {
        let w = self.word.load(Ordering::Relaxed);
        if state(w) != 0 || expect.is_some_and(|v| v != version(w)) {
            return false;
        }
        self.cas_to_exclusive(w)
    }

    /// Turn our sole shared hold into an exclusive one; fails if other sharers are present.
    #[inline]
    pub fn try_upgrade_shared(&self) -> bool {
        let w = self.word.load(Ordering::Relaxed);
        if state(w) != 1 {
            return false;
        }
        self.cas_to_exclusive(w)
    }

    #[inline]
    fn cas_to_exclusive(&self, w: u64) -> bool {
        let locked = version(w) | (EXCLUSIVE << STATE_SHIFT);
        if self
            .word
            .compare_exchange(w, locked, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            // Release fence: data stores we make from now on are ordered after the state change
            // for any optimistic reader that observes them (seqlock writer side).
            fence(Ordering::Release);
            true
        } else {
            false
        }
    }

    /// Release exclusive and bump the version: optimistic readers that overlapped restart.
    #[inline]
    pub fn unlock_exclusive(&self) {
        let w = self.word.load(Ordering::Relaxed);
        debug_assert_eq!(state(w), EXCLUSIVE, "unlock_exclusive on {w:#x}");
        // Release: publishes the section's data stores together with the new version.
        self.word
            .store(version(w).wrapping_add(1) & VERSION_MASK, Ordering::Release);
    }

    /// Release exclusive without bumping the version. Only for holders that changed nothing.
    #[inline]
    pub fn unlock_exclusive_unchanged(&self) {
        let w = self.word.load(Ordering::Relaxed);
        debug_assert_eq!(state(w), EXCLUSIVE);
        self.word.store(version(w), Ordering::Release);
    }

    /// Exclusive -> shared (one holder), bumping the version.
    #[inline]
    pub fn downgrade(&self) {
        let w = self.word.load(Ordering::Relaxed);
        debug_assert_eq!(state(w), EXCLUSIVE);
        self.word.store(
            (version(w).wrapping_add(1) & VERSION_MASK) | ONE_SHARED,
            Ordering::Release,
        );
    }
}

/// Spin-then-yield backoff for waits on latches. Suits machines with few cores: a waiter spins
/// briefly, then yields its core, then sleeps in short naps. A task that may pause pauses
/// instead (see [`crate::tasks`]).
#[derive(Default)]
pub struct Backoff {
    step: u32,
}

impl Backoff {
    pub fn new() -> Self {
        Backoff { step: 0 }
    }
    pub fn snooze(&mut self) {
        if crate::tasks::pause(crate::tasks::Wait::Idle) {
            // a task: the thread's other tasks ran meanwhile
            self.step = self.step.saturating_add(1);
            return;
        }
        if self.step < 6 {
            for _ in 0..(1 << self.step) {
                std::hint::spin_loop();
            }
        } else if self.step < 30 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        self.step = self.step.saturating_add(1);
    }

    /// Whether a wait that may not pause (a task holding guards) has gone on long enough that
    /// its operation should restart instead: what it waits for may be a paused task of its own
    /// thread, which cannot run while it waits (see the latch rule in [`crate::tasks`]).
    #[inline]
    pub fn stuck_in_task(&self) -> bool {
        self.step >= STUCK_STEPS && crate::tasks::in_task() && !crate::tasks::may_pause()
    }
}

/// Snoozes after which a task that may not pause restarts its operation.
const STUCK_STEPS: u32 = 8;

impl Default for HybridLatch {
    fn default() -> Self {
        Self::new()
    }
}

/// The latch's orderings checked by loom (interleavings of two or three threads up to a
/// preemption bound, and every value the memory model lets a relaxed load return). Run with
/// `RUSTFLAGS="--cfg loom" cargo test -p shoal-engine --lib --release loom` (CI does).
/// Broken on purpose once (2026-11-24): without the Release fence after taking the exclusive
/// latch, `a_validated_optimistic_read_never_sees_a_torn_write` fails; with a Relaxed store
/// in `unlock_exclusive`, `shared_and_exclusive_holders_never_overlap` fails.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::AtomicU64 as Word;
    use loom::sync::Arc;
    use loom::thread;

    /// Every interleaving with at most 3 preemptions (loom's advice for spin loops: the
    /// unbounded search does not end), every relaxed value.
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(f);
    }

    fn lock_exclusive(l: &HybridLatch) {
        while !l.try_lock_exclusive(None) {
            thread::yield_now();
        }
    }

    /// The optimistic read of page words (relaxed atomic loads, as `page.rs` does) against a
    /// writer that changes two words under the exclusive latch: a read that validates saw
    /// both words of one version, never one old and one new.
    #[test]
    fn a_validated_optimistic_read_never_sees_a_torn_write() {
        model(|| {
            let latch = Arc::new(HybridLatch::new());
            let words = Arc::new([Word::new(0), Word::new(0)]);
            let writer = {
                let (latch, words) = (Arc::clone(&latch), Arc::clone(&words));
                thread::spawn(move || {
                    lock_exclusive(&latch);
                    words[0].store(1, Ordering::Relaxed);
                    words[1].store(1, Ordering::Relaxed);
                    latch.unlock_exclusive();
                })
            };
            if let Some(v) = latch.optimistic_begin() {
                let a = words[0].load(Ordering::Relaxed);
                let b = words[1].load(Ordering::Relaxed);
                if latch.validate(v) {
                    assert_eq!(a, b, "validated a torn read");
                }
            }
            writer.join().unwrap();
            // after the writer left, a new optimistic read sees its whole write
            let v = latch.optimistic_begin().expect("no writer left");
            let (a, b) = (
                words[0].load(Ordering::Relaxed),
                words[1].load(Ordering::Relaxed),
            );
            assert!(latch.validate(v));
            assert_eq!((a, b), (1, 1));
        });
    }

    /// Shared holders only read, exclusive holders write: loom's checked cell reports any
    /// access the latch fails to order (a data race), and the count any lost update. Each
    /// thread tries once (no spinning, so the search stays finite).
    #[test]
    fn shared_and_exclusive_holders_never_overlap() {
        model(|| {
            let latch = Arc::new(HybridLatch::new());
            let cell = Arc::new(UnsafeCell::new(0u64));
            let wins = Arc::new(Word::new(0));
            let writers: Vec<_> = (0..2)
                .map(|_| {
                    let (latch, cell, wins) =
                        (Arc::clone(&latch), Arc::clone(&cell), Arc::clone(&wins));
                    thread::spawn(move || {
                        if latch.try_lock_exclusive(None) {
                            // SAFETY (of the test's own cell): the exclusive latch is held;
                            // loom checks that claim.
                            cell.with_mut(|p| unsafe { *p += 1 });
                            wins.fetch_add(1, Ordering::Relaxed);
                            latch.unlock_exclusive();
                        }
                    })
                })
                .collect();
            if latch.try_lock_shared(None) {
                // SAFETY: as above, with the shared latch (readers only).
                let v = cell.with(|p| unsafe { *p });
                assert!(v <= 2);
                latch.unlock_shared();
            }
            for w in writers {
                w.join().unwrap();
            }
            assert!(latch.try_lock_shared(None));
            // SAFETY: as above.
            let v = cell.with(|p| unsafe { *p });
            assert_eq!(v, wins.load(Ordering::Relaxed), "an update was lost");
            latch.unlock_shared();
        });
    }

    /// Two sharers that both try to upgrade: at most one becomes exclusive (it must be the
    /// only sharer), and its write is ordered against the other's read.
    #[test]
    fn of_two_sharers_at_most_one_upgrades() {
        model(|| {
            let latch = Arc::new(HybridLatch::new());
            let cell = Arc::new(UnsafeCell::new(0u64));
            let upgrades = Arc::new(Word::new(0));
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let (latch, cell, upgrades) =
                        (Arc::clone(&latch), Arc::clone(&cell), Arc::clone(&upgrades));
                    thread::spawn(move || {
                        while !latch.try_lock_shared(None) {
                            thread::yield_now();
                        }
                        // SAFETY: shared latch held: reading.
                        let _ = cell.with(|p| unsafe { *p });
                        if latch.try_upgrade_shared() {
                            upgrades.fetch_add(1, Ordering::Relaxed);
                            // SAFETY: exclusive now: writing.
                            cell.with_mut(|p| unsafe { *p += 1 });
                            latch.downgrade();
                        }
                        latch.unlock_shared();
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            let n = upgrades.load(Ordering::Relaxed);
            assert!(n <= 2);
            // SAFETY: every thread left.
            assert_eq!(cell.with(|p| unsafe { *p }), n);
            assert!(!latch.is_latched());
        });
    }

    /// A downgrade (exclusive -> shared) publishes the write and bumps the version: an
    /// optimistic reader that began before it fails validation, one after it sees the write.
    #[test]
    fn a_downgrade_publishes_the_write_and_fails_older_readers() {
        model(|| {
            let latch = Arc::new(HybridLatch::new());
            let word = Arc::new(Word::new(0));
            let v0 = latch.optimistic_begin().expect("unlatched");
            let writer = {
                let (latch, word) = (Arc::clone(&latch), Arc::clone(&word));
                thread::spawn(move || {
                    lock_exclusive(&latch);
                    word.store(7, Ordering::Relaxed);
                    latch.downgrade();
                    latch.unlock_shared();
                })
            };
            if let Some(v) = latch.optimistic_begin() {
                let x = word.load(Ordering::Relaxed);
                if latch.validate(v) {
                    assert!(x == 0 || x == 7);
                    if v != v0 {
                        assert_eq!(x, 7, "a reader of the new version missed the write");
                    }
                }
            }
            writer.join().unwrap();
            assert!(!latch.validate(v0), "the version was not bumped");
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_exclude_each_other() {
        let l = HybridLatch::new();
        let v = l.optimistic_begin().unwrap();
        assert!(l.try_lock_shared(None));
        assert!(l.try_lock_shared(Some(v)));
        assert!(!l.try_lock_exclusive(None), "exclusive while shared");
        assert!(l.validate(v), "shared holders do not invalidate");
        assert!(!l.try_upgrade_shared(), "two sharers: no upgrade");
        l.unlock_shared();
        assert!(l.try_upgrade_shared(), "sole sharer upgrades");
        assert!(l.optimistic_begin().is_none());
        assert!(!l.try_lock_shared(None));
        assert!(!l.validate(v));
        l.unlock_exclusive();
        assert!(!l.validate(v), "version bumped");
        let v2 = l.optimistic_begin().unwrap();
        assert_eq!(v2, v + 1);
        assert!(!l.try_lock_exclusive(Some(v)), "stale expected version");
        assert!(l.try_lock_exclusive(Some(v2)));
        l.downgrade();
        assert!(!l.try_lock_exclusive(None));
        assert!(l.try_lock_shared(None));
        l.unlock_shared();
        l.unlock_shared();
        assert!(!l.is_latched());
        assert_eq!(l.optimistic_begin(), Some(v2 + 1));
    }

    #[test]
    fn shared_count_saturates() {
        let l = HybridLatch::new();
        for _ in 0..MAX_SHARED {
            assert!(l.try_lock_shared(None));
        }
        assert!(!l.try_lock_shared(None), "more than MAX_SHARED holders");
        for _ in 0..MAX_SHARED {
            l.unlock_shared();
        }
        assert!(l.try_lock_exclusive(None));
    }
}
