//! Waiting that suits machines with few cores: spin briefly, then park; the writer of the
//! awaited word wakes the parked thread. Pure busy-polling is an option ([`WaitMode::Poll`]).
//!
//! The handshake between a waiter and a writer is Dekker's: the waiter announces itself
//! (`waiting = true`), then re-checks the condition; the writer makes the condition true, then
//! checks `waiting`. With a `SeqCst` fence between each side's store and load, at least one of
//! them sees the other's store, so a waiter never sleeps through the write that readies it.
//! (This is the one place a `SeqCst` fence is needed: it orders a store before a later load,
//! which acquire/release cannot.) Parks also time out after [`PARK_SLICE`], so a waiter
//! re-checks peer liveness and deadlines regularly.

use parking_lot::Mutex;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Longest single park before a waiter re-checks its condition.
pub const PARK_SLICE: Duration = Duration::from_millis(10);
/// Spin iterations before parking (in `Spin` mode).
pub const SPINS: u32 = 2_000;

/// How waits behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitMode {
    /// Spin briefly, then park until woken (the default: good on few cores).
    #[default]
    Park,
    /// Busy-poll (lowest latency when every waiter has a core of its own). Yields the core
    /// every 256 polls, so an oversubscribed machine still runs the thread being waited for.
    Poll,
}

/// One parked thread at most (a worker, or a handler).
pub struct WaitQueue {
    waiting: AtomicBool,
    thread: Mutex<Option<Thread>>,
}

impl Default for WaitQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl WaitQueue {
    pub fn new() -> Self {
        WaitQueue {
            waiting: AtomicBool::new(false),
            thread: Mutex::new(None),
        }
    }

    /// Writer side: the condition was just made true; wake the waiter if one is parked.
    #[inline]
    pub fn wake(&self) {
        // SeqCst fence: orders the writer's preceding store (the condition) before this load
        // of `waiting` (see module docs).
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) {
            if let Some(t) = self.thread.lock().as_ref() {
                t.unpark();
            }
        }
    }

    /// Waiter side: wait until `ready()` or `deadline`. Returns whether `ready()` held.
    /// `give_up()` is checked between parks (e.g. "the peer died"). `ready` may consume what
    /// it finds (a reply): it is never called again after it returned `true`.
    pub fn wait(
        &self,
        mode: WaitMode,
        deadline: Option<Instant>,
        ready: impl FnMut() -> bool,
        give_up: impl FnMut() -> bool,
    ) -> bool {
        self.wait_spinning(SPINS, mode, deadline, ready, give_up)
    }

    /// [`WaitQueue::wait`], spinning `spins` times (instead of [`SPINS`]) before it parks.
    pub fn wait_spinning(
        &self,
        spins: u32,
        mode: WaitMode,
        deadline: Option<Instant>,
        mut ready: impl FnMut() -> bool,
        mut give_up: impl FnMut() -> bool,
    ) -> bool {
        for _ in 0..spins {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        let mut polls = 0u32;
        loop {
            if ready() {
                return true;
            }
            if give_up() || deadline.is_some_and(|d| Instant::now() >= d) {
                return ready();
            }
            match mode {
                WaitMode::Poll => {
                    polls = polls.wrapping_add(1);
                    if polls.is_multiple_of(256) {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
                WaitMode::Park => {
                    *self.thread.lock() = Some(std::thread::current());
                    self.waiting.store(true, Ordering::Relaxed);
                    // SeqCst fence: orders the store of `waiting` before the re-check below.
                    fence(Ordering::SeqCst);
                    if ready() {
                        self.waiting.store(false, Ordering::Relaxed);
                        return true;
                    }
                    let slice = deadline
                        .map(|d| d.saturating_duration_since(Instant::now()).min(PARK_SLICE))
                        .unwrap_or(PARK_SLICE);
                    std::thread::park_timeout(slice);
                    self.waiting.store(false, Ordering::Relaxed);
                }
            }
        }
    }
}
