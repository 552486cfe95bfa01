//! Tasks: many operations in flight on one thread.
//!
//! [`run`] runs `n` tasks on the calling thread, each a stackful coroutine (corosensei) with
//! its own stack, so that B-tree and guard code stay plain synchronous code. A task that would
//! wait *pauses* instead and the thread runs the next task:
//!
//! - a page read from the store (the read is queued in the thread's io_uring ring; the
//!   scheduler hands every queued read to the kernel in one `io_uring_enter` per round and
//!   reaps completions between tasks: see shoal-storage's `io`, *Paused waits*);
//! - a latch held by someone else (what the latch backoff would spin or sleep for);
//! - a remote miss on a cluster node, while the answer is on its way;
//! - no free frame (the provider is evicting).
//!
//! A task gives the others a turn with [`yield_now`] (drivers call it between operations);
//! without waits or yields one task would run to its end before the next starts.
//!
//! **The latch rule.** A task never pauses while it holds a latch another task on its thread
//! could wait for: a worker's shared and exclusive guards are counted per thread, and while
//! the running task holds any, a pause is refused (the wait happens the old way, blocking the
//! thread). The one latch a paused task holds is the exclusive latch of a frame it is loading
//! from the store; a task that meets such a frame pauses too, or, if it holds guards and so
//! may not pause, its operation restarts ([`Restart::Retry`](crate::Restart), dropping its
//! guards) rather than wait for a task that cannot run. Debug builds check after every switch
//! that the paused task holds no guard.
//!
//! Each task uses its own [`Worker`](crate::Worker) (a worker's counters and log group are
//! not shared between tasks).

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use std::cell::Cell;

/// Stack of each task. The engine and B-tree keep page-sized buffers on the stack in places;
/// 256 KiB leaves ample room and is committed only as far as it is touched.
pub const TASK_STACK_BYTES: usize = 256 << 10;

/// Most tasks one [`run`] takes (each has a stack; more than the ring has entries would only
/// queue reads behind each other).
pub const MAX_TASKS: usize = 1024;

/// Why a task paused: the scheduler blocks in the kernel only when every task waits for a
/// read, and gives up the core for a moment when every task waits for another thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// A read it queued.
    Io,
    /// Another thread's progress: a latch, a remote answer, a free frame, the log's flush.
    Idle,
    /// Nothing: it gave the others a turn ([`yield_now`]).
    Ready,
}

type Task = Coroutine<(), Wait, (), DefaultStack>;

thread_local! {
    /// The running task's yielder (null outside tasks, and in the scheduler between them).
    static CURRENT: Cell<*const Yielder<(), Wait>> = const { Cell::new(std::ptr::null()) };
    /// Shared and exclusive guards the running code of this thread holds (see the latch rule).
    static GUARDS: Cell<u32> = const { Cell::new(0) };
    /// [`turn`] calls of the running task since the scheduler last resumed it.
    static TURNS: Cell<u32> = const { Cell::new(0) };
}

/// Operations a task runs without pausing before [`turn`] gives the others a turn. A switch
/// costs about as much as a few percent of an in-memory lookup, so a task that never misses
/// switches once per this many operations; a task that misses pauses anyway.
pub const TURN_OPS: u32 = 8;

/// Counts of one [`run`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskCounts {
    /// Times a task paused for a read.
    pub io_pauses: u64,
    /// Times a task paused waiting for another thread (a latch, a remote answer, a free
    /// frame, the log).
    pub idle_pauses: u64,
    /// Times a task gave the others a turn ([`yield_now`]).
    pub yields: u64,
    /// Scheduler rounds that blocked in the kernel because every task waited for a read.
    pub blocked_rounds: u64,
    /// Scheduler rounds after which the thread gave up its core (every task waited, some for
    /// other threads).
    pub idle_rounds: u64,
}

/// Whether the calling code runs inside a task.
#[inline]
pub fn in_task() -> bool {
    !CURRENT.get().is_null()
}

/// Whether the calling code may pause now: it runs in a task that holds no guard.
#[inline]
pub(crate) fn may_pause() -> bool {
    in_task() && GUARDS.get() == 0
}

/// A guard was taken (every shared and exclusive guard of a [`Worker`](crate::Worker)).
#[inline]
pub(crate) fn guard_taken() {
    GUARDS.set(GUARDS.get() + 1);
}

/// A guard was dropped.
#[inline]
pub(crate) fn guard_dropped() {
    let g = GUARDS.get();
    debug_assert!(g > 0, "more guards dropped than taken on this thread");
    GUARDS.set(g.saturating_sub(1));
}

/// Pause the running task for `why` and run others; returns false (without pausing) where
/// pausing is not allowed (outside tasks, or holding a guard).
#[inline]
pub(crate) fn pause(why: Wait) -> bool {
    if !may_pause() {
        return false;
    }
    let y = CURRENT.replace(std::ptr::null());
    // SAFETY: `y` was set by this task's body from the `&Yielder` corosensei passed it; the
    // yielder lives on the task's stack frame of that body, which is running (we are on its
    // stack), so the pointer is valid. It is only used on this thread.
    unsafe { (*y).suspend(why) };
    CURRENT.set(y);
    true
}

/// Let the thread's other tasks run before this one goes on; returns whether it did (false
/// outside tasks and while the task holds a guard). Call it between operations.
pub fn yield_now() -> bool {
    pause(Wait::Ready)
}

/// The end of an operation: give the thread's other tasks a turn if this task has run
/// [`TURN_OPS`] operations since it last paused; returns whether it did (false outside tasks).
/// Drivers call it between operations: it keeps a task that never misses from holding the
/// thread, at a switch per [`TURN_OPS`] operations instead of one per operation.
#[inline]
pub fn turn() -> bool {
    if !in_task() {
        return false;
    }
    let n = TURNS.get() + 1;
    if n < TURN_OPS {
        TURNS.set(n);
        return false;
    }
    yield_now()
}

fn io_pause() -> bool {
    pause(Wait::Io)
}

/// Run `n` tasks (`1..=`[`MAX_TASKS`]) on this thread: task `i` runs `body(i)`. Returns when
/// every task returned. Tasks switch only where one would wait (see the module page) or calls
/// [`yield_now`]; they never run in parallel, so `body` needs no `Sync`.
///
/// A panic in a task reaches the caller, after every read the tasks have in flight
/// completed (the others' stacks are then unwound). Fails if a stack cannot be mapped.
pub fn run<F: Fn(usize)>(n: usize, body: F) -> std::io::Result<TaskCounts> {
    assert!(
        (1..=MAX_TASKS).contains(&n),
        "tasks: {n} not in 1..={MAX_TASKS}"
    );
    assert!(!in_task(), "tasks::run inside a task");
    let body = &body;
    let mut tasks: Vec<Task> = Vec::with_capacity(n);
    for i in 0..n {
        let stack = DefaultStack::new(TASK_STACK_BYTES)?;
        // SAFETY: the coroutine borrows `body`, which outlives it: every coroutine is driven
        // to its end or dropped before this function returns (`tasks` is a local, never
        // forgotten).
        let t = unsafe {
            Coroutine::with_stack_unchecked(stack, move |y: &Yielder<(), Wait>, ()| {
                CURRENT.set(y);
                body(i);
                debug_assert_eq!(GUARDS.get(), 0, "task {i} ended holding guards");
                CURRENT.set(std::ptr::null());
            })
        };
        tasks.push(t);
    }
    // Declared after `tasks`, so dropped first (also when a task's panic unwinds through
    // here): the reads in flight complete before any paused task's stack is unwound.
    let _hook = Hook::install();
    let mut counts = TaskCounts::default();
    let mut live: Vec<usize> = (0..n).collect();
    while !live.is_empty() {
        let (mut ready, mut idle) = (false, false);
        live.retain(|&i| {
            TURNS.set(0);
            let r = tasks[i].resume(());
            CURRENT.set(std::ptr::null());
            debug_assert_eq!(GUARDS.get(), 0, "task {i} paused holding guards");
            match r {
                CoroutineResult::Yield(Wait::Io) => counts.io_pauses += 1,
                CoroutineResult::Yield(Wait::Idle) => {
                    counts.idle_pauses += 1;
                    idle = true;
                }
                CoroutineResult::Yield(Wait::Ready) => {
                    counts.yields += 1;
                    ready = true;
                }
                CoroutineResult::Return(()) => return false,
            }
            true
        });
        if live.is_empty() || ready {
            shoal_storage::io::submit_queued(false);
            continue;
        }
        // every task waits: for reads only, block until one completes; else look again
        // after letting the threads they wait for run
        let block = !idle && shoal_storage::io::in_flight() > 0;
        counts.blocked_rounds += u64::from(block);
        shoal_storage::io::submit_queued(block);
        if !block {
            counts.idle_rounds += 1;
            std::thread::yield_now();
        }
    }
    Ok(counts)
}

/// The pause hook of a thread running tasks, removed (after draining the ring) on drop.
struct Hook;

impl Hook {
    fn install() -> Hook {
        shoal_storage::io::set_pause(Some(io_pause));
        Hook
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        while shoal_storage::io::submit_queued(true) > 0 {}
        shoal_storage::io::set_pause(None);
        CURRENT.set(std::ptr::null()); // a task's panic skipped the scheduler's reset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_interleave_where_they_yield() {
        let log = std::cell::RefCell::new(Vec::new());
        run(3, |i| {
            for step in 0..2 {
                log.borrow_mut().push((i, step));
                assert!(yield_now());
            }
        })
        .unwrap();
        assert_eq!(
            *log.borrow(),
            vec![(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
        );
    }

    #[test]
    fn turn_switches_once_per_turn_ops_operations() {
        let log = std::cell::RefCell::new(Vec::new());
        let ops = TURN_OPS as usize * 2;
        run(2, |i| {
            for op in 0..ops {
                log.borrow_mut().push(i);
                assert_eq!(turn(), (op + 1) % TURN_OPS as usize == 0, "op {op}");
            }
        })
        .unwrap();
        // each task runs TURN_OPS operations, then the other
        let t = TURN_OPS as usize;
        let want: Vec<usize> = (0..4).flat_map(|k| std::iter::repeat_n(k % 2, t)).collect();
        assert_eq!(*log.borrow(), want);
        assert!(!turn(), "outside tasks nothing pauses");
    }

    #[test]
    fn a_task_holding_a_guard_does_not_pause() {
        run(2, |_| {
            guard_taken();
            assert!(!yield_now());
            guard_dropped();
            assert!(yield_now());
        })
        .unwrap();
        assert!(!yield_now(), "outside tasks nothing pauses");
    }

    #[test]
    fn a_panic_in_a_task_reaches_the_caller() {
        let r = std::panic::catch_unwind(|| {
            run(4, |i| {
                yield_now();
                if i == 2 {
                    panic!("task 2 fails");
                }
                yield_now();
            })
        });
        assert!(r.is_err());
        assert!(!in_task());
        // the thread can run tasks again
        assert_eq!(run(1, |_| {}).unwrap(), TaskCounts::default());
    }
}
