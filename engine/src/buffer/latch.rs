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

use std::sync::atomic::{fence, AtomicU64, Ordering};

const STATE_SHIFT: u32 = 56;
const VERSION_MASK: u64 = (1 << STATE_SHIFT) - 1;
const EXCLUSIVE: u64 = 0xFF;
/// Most simultaneous shared holders of one latch.
pub const MAX_SHARED: u64 = 0xFE;
const ONE_SHARED: u64 = 1 << STATE_SHIFT;

/// A hybrid optimistic / shared / exclusive latch.
#[derive(Debug, Default)]
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
    pub const fn new() -> Self {
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
/// briefly, then yields its core, then sleeps in short naps.
#[derive(Default)]
pub struct Backoff {
    step: u32,
}

impl Backoff {
    pub fn new() -> Self {
        Backoff { step: 0 }
    }
    pub fn snooze(&mut self) {
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
