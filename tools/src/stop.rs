//! Stopping on Ctrl-C (SIGINT) or SIGTERM: the first signal asks the running command to stop
//! (its workers finish their current operation, what was measured so far is reported, the
//! store is closed clean, exit status [`STOPPED_EXIT`]); a second signal exits at once (status
//! [`ABORTED_EXIT`], the store left unclean as after a crash, node processes this one started
//! killed with it).
//!
//! The handler only flips an atomic flag (async-signal-safe); the drivers poll
//! [`requested`] where they wait or loop.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Exit status after a stop by a signal with the store closed clean (what shells use for SIGINT).
pub const STOPPED_EXIT: u8 = 130;
/// Exit status after a second signal: exited at once, the store not closed.
pub const ABORTED_EXIT: i32 = 3;

/// Node processes this process started and has not reaped (0: a free entry); a second signal
/// kills them too (`kill` is async-signal-safe, a lock would not be).
static CHILDREN: [AtomicI32; 64] = [const { AtomicI32::new(0) }; 64];

/// Note a node process this one started (at most 64 are remembered).
pub fn remember_child(pid: u32) {
    for c in &CHILDREN {
        if c.compare_exchange(0, pid as i32, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return;
        }
    }
}

/// A child was reaped (its pid may be reused): forget it.
pub fn forget_child(pid: u32) {
    for c in &CHILDREN {
        let _ = c.compare_exchange(pid as i32, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// The message of the first signal (written with `write(2)`, which is async-signal-safe).
const FIRST: &[u8] =
    b"\nshoal: stopping (finishing the current operations, closing the store clean); \
      send the signal again to exit at once\n";

extern "C" fn on_signal(sig: libc::c_int) {
    // SeqCst: one flag, read by every driver thread; the order against other memory does not
    // matter (a stop request carries no data).
    if REQUESTED.swap(true, Ordering::SeqCst) {
        for c in &CHILDREN {
            let pid = c.load(Ordering::SeqCst);
            if pid > 0 {
                // SAFETY: kill(2) is async-signal-safe; the pid is a child not yet reaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        // SAFETY: _exit is async-signal-safe and ends the process without running any Rust code.
        unsafe { libc::_exit(ABORTED_EXIT) };
    }
    let _ = sig;
    // SAFETY: write(2) is async-signal-safe; FIRST is a static buffer of FIRST.len() bytes.
    unsafe {
        libc::write(2, FIRST.as_ptr().cast(), FIRST.len());
    }
}

/// Install the SIGINT and SIGTERM handlers (before any thread starts).
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is a valid value to fill in; the handler is an `extern "C"`
        // function that touches only an atomic and async-signal-safe calls; SA_RESTART keeps
        // interrupted system calls (reads, writes, sleeps of other threads) going.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                log::warn!(
                    "installing the handler of signal {sig}: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    }
}

/// Ask for a stop from inside (standard output was closed).
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// A stop was asked for.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Sleep until `t`, or less if a stop is asked for (checked every 20 ms). Returns `false` if it
/// woke early for a stop.
pub fn sleep_until(t: Instant) -> bool {
    loop {
        if requested() {
            return false;
        }
        let now = Instant::now();
        if now >= t {
            return true;
        }
        std::thread::sleep((t - now).min(Duration::from_millis(20)));
    }
}

/// The text that says a run was stopped by a signal, for the summary.
pub const STOPPED: &str = "stopped by a signal";
