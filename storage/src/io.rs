//! I/O backends: io_uring (default) and pread/pwrite (fallback).
//!
//! Both execute a *batch* of page-sized operations and report one result per operation
//! (bytes transferred, or a negative errno). io_uring keeps the whole batch in flight at once
//! (up to [`RING_ENTRIES`] requests per thread); the fallback runs it one request at a time.
//!
//! Rings are per thread (`thread_local!`), created on a thread's first I/O, because a ring's
//! submission queue is single-producer. Files are not registered with the ring, so one ring
//! serves every store a thread touches.
//!
//! **Paused waits.** A thread that runs many tasks (shoal-engine's `tasks`) installs a pause
//! hook ([`set_pause`]). Its io_uring batches then go into the thread's ring without a wait:
//! the task that issued one calls the hook (which switches to another task) until the batch's
//! completions are in, and the thread's scheduler submits what its tasks queued and reaps
//! completions between tasks ([`submit_queued`]), so one `io_uring_enter` carries the reads of
//! many tasks. Completions are matched to batches by a per-thread token, whichever task reaps
//! them. When the hook declines (the task holds latches another task could wait for), the
//! batch waits in the kernel as usual.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::fd::RawFd;

/// Submission-queue size of each thread's ring: the most requests one thread keeps in flight.
pub const RING_ENTRIES: u32 = 256;

/// Which backend a store should use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// io_uring if it can be set up here, else pread/pwrite with a log line saying why.
    #[default]
    Auto,
    /// io_uring or an error.
    Uring,
    /// pread/pwrite, always.
    Pread,
}

/// The backend a store actually runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Uring,
    Pread,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Uring => "io_uring",
            Backend::Pread => "pread/pwrite",
        })
    }
}

/// Pick a backend: probe io_uring by building a small ring.
pub fn choose(choice: BackendChoice) -> std::io::Result<Backend> {
    match choice {
        BackendChoice::Pread => Ok(Backend::Pread),
        BackendChoice::Uring => io_uring::IoUring::new(8).map(|_| Backend::Uring),
        BackendChoice::Auto => match io_uring::IoUring::new(8) {
            Ok(_) => Ok(Backend::Uring),
            Err(e) => {
                log::warn!("io_uring cannot be set up here ({e}); using the pread/pwrite backend");
                Ok(Backend::Pread)
            }
        },
    }
}

/// One page-sized read or write.
#[derive(Debug, Clone, Copy)]
pub struct IoOp {
    pub fd: RawFd,
    pub offset: u64,
    pub buf: *mut u8,
    pub len: u32,
    pub write: bool,
}

thread_local! {
    static RING: RefCell<Option<io_uring::IoUring>> = const { RefCell::new(None) };
    /// The pause hook of a thread that runs tasks: switches to another task and returns true,
    /// or returns false when the running task may not pause now.
    static PAUSE: Cell<Option<fn() -> bool>> = const { Cell::new(None) };
    /// Requests this thread put in its ring whose completions nobody reaped yet.
    static IN_FLIGHT: Cell<usize> = const { Cell::new(0) };
    /// Requests put in the ring but not yet handed to the kernel.
    static QUEUED: Cell<usize> = const { Cell::new(0) };
    /// The next token (a paused batch's requests carry tokens as user data).
    static NEXT_TOKEN: Cell<u64> = const { Cell::new(0) };
    /// Results of paused batches' requests reaped by whoever reaped them, by token.
    static DONE: RefCell<HashMap<u64, i64>> = RefCell::new(HashMap::new());
}

/// Install (or with `None` remove) this thread's pause hook: while one is installed, this
/// thread's io_uring batches wait by calling it (see the module's *Paused waits*). Remove it
/// only when [`in_flight`] is 0.
pub fn set_pause(hook: Option<fn() -> bool>) {
    assert!(
        hook.is_some() || IN_FLIGHT.get() == 0,
        "the pause hook was removed with requests in flight"
    );
    PAUSE.set(hook);
}

/// Requests this thread's paused batches have in flight (queued or in the kernel).
pub fn in_flight() -> usize {
    IN_FLIGHT.get()
}

/// For the scheduler of a thread with a pause hook: hand the queued requests to the kernel,
/// and with `wait` (every task is waiting for I/O) block until at least one completes; then
/// reap what completed. Returns how many requests are still in flight. Aborts the process if
/// the kernel refuses the ring (requests in flight could still write into their buffers).
pub fn submit_queued(wait: bool) -> usize {
    if IN_FLIGHT.get() == 0 {
        return 0;
    }
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        let ring = slot.as_mut().expect("requests in flight imply a ring");
        enter(ring, usize::from(wait), IN_FLIGHT.get());
        QUEUED.set(0);
        reap(ring);
    });
    IN_FLIGHT.get()
}

/// `io_uring_enter`: submit the queue, waiting for `want` completions; retries on EINTR/
/// EAGAIN/EBUSY; aborts on any other failure (requests in flight may still write into their
/// buffers, so no caller could safely go on).
fn enter(ring: &mut io_uring::IoUring, want: usize, in_flight: usize) {
    let mut tries = 0;
    loop {
        match ring.submit_and_wait(want) {
            Ok(_) => return,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                ) && tries < 1_000_000 =>
            {
                tries += 1;
                std::thread::yield_now();
            }
            Err(e) => {
                log::error!("io_uring_enter failed with {in_flight} requests in flight: {e}");
                std::process::abort();
            }
        }
    }
}

/// Move every completion in `ring` into the table of results by token.
fn reap(ring: &mut io_uring::IoUring) {
    let mut n = 0;
    DONE.with(|d| {
        let mut d = d.borrow_mut();
        for cqe in ring.completion() {
            d.insert(cqe.user_data(), cqe.result() as i64);
            n += 1;
        }
    });
    IN_FLIGHT.set(IN_FLIGHT.get() - n);
}

/// Execute `ops`; `results[i]` receives bytes transferred or `-errno` for `ops[i]`.
///
/// # Safety
/// Every `op.buf` must be valid for `op.len` bytes (reads: writable, no other access to those
/// bytes from Rust code that could conflict with the kernel writing them; writes: readable and
/// unchanged) until this function returns, and aligned as the file's open mode requires.
pub unsafe fn run_batch(backend: Backend, ops: &[IoOp], results: &mut [i64]) {
    assert_eq!(ops.len(), results.len());
    match backend {
        Backend::Pread => {
            for (op, r) in ops.iter().zip(results.iter_mut()) {
                // SAFETY: forwarded from the caller's contract on op.buf.
                *r = unsafe { pread_pwrite(op) };
            }
        }
        Backend::Uring => {
            let fallback = RING.with(|cell| {
                let mut slot = cell.borrow_mut();
                if slot.is_none() {
                    match io_uring::IoUring::new(RING_ENTRIES) {
                        Ok(r) => *slot = Some(r),
                        Err(e) => {
                            log::warn!("io_uring ring for this thread failed ({e}); using pread");
                            return true;
                        }
                    }
                }
                if PAUSE.get().is_some() {
                    return false; // below, with the ring borrowed only between pauses
                }
                let ring = slot.as_mut().expect("ring set above");
                // SAFETY: forwarded from the caller's contract.
                unsafe { uring_batch(ring, ops, results) };
                false
            });
            if fallback {
                // SAFETY: forwarded from the caller's contract.
                unsafe { run_batch(Backend::Pread, ops, results) }
            } else if let Some(pause) = PAUSE.get() {
                // SAFETY: forwarded from the caller's contract.
                unsafe { paused_batch(pause, ops, results) }
            }
        }
    }
}

/// Most pages one `pwritev` takes (well under IOV_MAX).
const MAX_RUN: usize = 256;

/// Write `ops` (all writes) synchronously: each run of ops that are back to back in one file
/// (after sorting by file and offset) with one `pwritev`, the rest with `pwrite`. A run whose
/// `pwritev` fails or comes up short is written again op by op, so that each op gets its own
/// result (rewriting the same bytes is harmless).
///
/// # Safety
/// As [`run_batch`].
pub unsafe fn write_runs(ops: &[IoOp], results: &mut [i64]) {
    assert_eq!(ops.len(), results.len());
    let mut order: Vec<usize> = (0..ops.len()).collect();
    order.sort_unstable_by_key(|&i| (ops[i].fd, ops[i].offset));
    let mut k = 0;
    while k < order.len() {
        let first = &ops[order[k]];
        debug_assert!(first.write);
        let mut n = 1;
        while k + n < order.len() && n < MAX_RUN {
            let (prev, next) = (&ops[order[k + n - 1]], &ops[order[k + n]]);
            if next.fd != first.fd || next.offset != prev.offset + prev.len as u64 {
                break;
            }
            n += 1;
        }
        let run = &order[k..k + n];
        let total: u64 = run.iter().map(|&i| ops[i].len as u64).sum();
        let whole = n > 1 && {
            let iov: Vec<libc::iovec> = run
                .iter()
                .map(|&i| libc::iovec {
                    iov_base: ops[i].buf.cast(),
                    iov_len: ops[i].len as usize,
                })
                .collect();
            // SAFETY: every buffer is valid and unchanged for its op's length (the caller's
            // contract); `iov` lives across the call; fd is an open file.
            let r = unsafe {
                libc::pwritev(
                    first.fd,
                    iov.as_ptr(),
                    iov.len() as libc::c_int,
                    first.offset as libc::off_t,
                )
            };
            r >= 0 && r as u64 == total
        };
        if whole {
            for &i in run {
                results[i] = ops[i].len as i64;
            }
        } else {
            for &i in run {
                // SAFETY: forwarded from the caller's contract on op.buf.
                results[i] = unsafe { pread_pwrite(&ops[i]) };
            }
        }
        k += n;
    }
}

/// # Safety
/// See [`run_batch`].
unsafe fn pread_pwrite(op: &IoOp) -> i64 {
    let mut done = 0usize;
    while done < op.len as usize {
        // SAFETY: buf + done stays inside the caller's buffer of op.len bytes.
        let p = unsafe { op.buf.add(done) };
        let rest = op.len as usize - done;
        let off = (op.offset + done as u64) as libc::off_t;
        // SAFETY: p is valid for `rest` bytes per the caller's contract; fd is an open file.
        let n = unsafe {
            if op.write {
                libc::pwrite(op.fd, p as *const libc::c_void, rest, off)
            } else {
                libc::pread(op.fd, p as *mut libc::c_void, rest, off)
            }
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return -(err.raw_os_error().unwrap_or(libc::EIO) as i64);
        }
        if n == 0 {
            break; // end of file on read
        }
        done += n as usize;
    }
    done as i64
}

/// Run `ops` on this thread's ring (which exists) waiting by `pause` (see the module's
/// *Paused waits*).
///
/// # Safety
/// See [`run_batch`]. The buffers stay the caller's until this returns, and it returns only
/// when every request completed: a pause never ends the wait early, and a task dropped while
/// paused here is dropped only after its thread's scheduler drained the ring.
unsafe fn paused_batch(pause: fn() -> bool, ops: &[IoOp], results: &mut [i64]) {
    let first = NEXT_TOKEN.get();
    NEXT_TOKEN.set(first + ops.len() as u64);
    let mut next = 0usize;
    while next < ops.len() {
        RING.with(|cell| {
            let mut slot = cell.borrow_mut();
            let ring = slot.as_mut().expect("run_batch made the ring");
            let mut pushed = 0;
            {
                let mut sq = ring.submission();
                while next < ops.len() && !sq.is_full() {
                    let op = &ops[next];
                    let e = sqe(op);
                    // SAFETY: the buffer stays valid until this request's completion is
                    // reaped, which this function waits for (caller's contract).
                    unsafe { sq.push(&e.user_data(first + next as u64)) }
                        .expect("checked not full");
                    next += 1;
                    pushed += 1;
                }
            }
            IN_FLIGHT.set(IN_FLIGHT.get() + pushed);
            QUEUED.set(QUEUED.get() + pushed);
            if next < ops.len() {
                // the queue is full: hand it to the kernel to make room
                enter(ring, 0, IN_FLIGHT.get());
                QUEUED.set(0);
                reap(ring);
            }
        });
    }
    let mut left = ops.len();
    while left > 0 {
        left = DONE.with(|d| {
            let mut d = d.borrow_mut();
            for (i, r) in results.iter_mut().enumerate() {
                if let Some(v) = d.remove(&(first + i as u64)) {
                    *r = v;
                    left -= 1;
                }
            }
            left
        });
        if left > 0 && !pause() {
            RING.with(|cell| {
                let mut slot = cell.borrow_mut();
                let ring = slot.as_mut().expect("run_batch made the ring");
                enter(ring, 1, IN_FLIGHT.get());
                QUEUED.set(0);
                reap(ring);
            });
        }
    }
    // SAFETY: every request completed; forwarded from the caller's contract.
    unsafe { finish_short(ops, results) };
}

/// # Safety
/// See [`run_batch`].
unsafe fn uring_batch(ring: &mut io_uring::IoUring, ops: &[IoOp], results: &mut [i64]) {
    let mut next = 0usize;
    let mut inflight = 0usize;
    while next < ops.len() || inflight > 0 {
        {
            let mut sq = ring.submission();
            while next < ops.len() && !sq.is_full() {
                let op = &ops[next];
                let e = sqe(op);
                // SAFETY: the buffer stays valid until we reap this entry's completion below,
                // which happens before this function returns (caller's contract).
                unsafe { sq.push(&e.user_data(next as u64)) }.expect("checked not full");
                next += 1;
                inflight += 1;
            }
        }
        enter(ring, 1, inflight);
        for cqe in ring.completion() {
            let i = cqe.user_data() as usize;
            results[i] = cqe.result() as i64;
            inflight -= 1;
        }
    }
    // SAFETY: every request completed; forwarded from the caller's contract.
    unsafe { finish_short(ops, results) };
}

/// Short transfers (rare with O_DIRECT, possible at end of file): finish them synchronously.
///
/// # Safety
/// See [`run_batch`]; every request in `ops` completed with `results`.
unsafe fn finish_short(ops: &[IoOp], results: &mut [i64]) {
    for (op, r) in ops.iter().zip(results.iter_mut()) {
        if *r > 0 && (*r as u32) < op.len {
            let rest = IoOp {
                // SAFETY: *r < op.len, so the offset stays within the buffer.
                buf: unsafe { op.buf.add(*r as usize) },
                offset: op.offset + *r as u64,
                len: op.len - *r as u32,
                ..*op
            };
            // SAFETY: a sub-range of the caller's buffer.
            let more = unsafe { pread_pwrite(&rest) };
            *r = if more < 0 { more } else { *r + more };
        }
    }
}

/// Whether `e` says the device (or the file's size limit, or the user's quota) has no room.
/// The submission entry of `op` (a read or a write at its offset), without user data.
fn sqe(op: &IoOp) -> io_uring::squeue::Entry {
    use io_uring::{opcode, types};
    if op.write {
        opcode::Write::new(types::Fd(op.fd), op.buf as *const u8, op.len)
            .offset(op.offset)
            .build()
    } else {
        opcode::Read::new(types::Fd(op.fd), op.buf, op.len)
            .offset(op.offset)
            .build()
    }
}

pub(crate) fn is_full(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EFBIG) | Some(libc::EDQUOT)
    )
}

/// Reserve `len` bytes of `file` from `off` (and grow its size to cover them).
pub(crate) fn fallocate(file: &std::fs::File, off: u64, len: u64) -> std::io::Result<()> {
    let (Ok(off), Ok(len)) = (libc::off_t::try_from(off), libc::off_t::try_from(len)) else {
        return Err(std::io::Error::from_raw_os_error(libc::EFBIG));
    };
    loop {
        // SAFETY: fallocate on a file descriptor `file` owns; no memory is passed.
        let r = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(file), 0, off, len) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::io::AsRawFd;

    #[test]
    fn write_runs_writes_neighbours_together_and_each_op_gets_its_result() {
        let f = tempfile::tempfile().unwrap();
        // offsets out of order: 0, 4096, 8192, 12288 make one run, 20480 stands alone
        let offsets = [8192u64, 20480, 0, 12288, 4096];
        let mut bufs: Vec<Vec<u8>> = offsets
            .iter()
            .map(|&o| vec![(o / 4096) as u8 + 1; 4096])
            .collect();
        let ops: Vec<IoOp> = offsets
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&offset, b)| IoOp {
                fd: f.as_raw_fd(),
                offset,
                buf: b.as_mut_ptr(),
                len: 4096,
                write: true,
            })
            .collect();
        let mut res = vec![0i64; ops.len()];
        // SAFETY: the buffers live and stay unchanged across the call.
        unsafe { write_runs(&ops, &mut res) };
        assert_eq!(res, vec![4096; 5]);
        let mut all = vec![0u8; 6 * 4096];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut all, 0).unwrap();
        for (page, want) in all.chunks(4096).zip([1u8, 2, 3, 4, 0, 6]) {
            assert!(page.iter().all(|&b| b == want), "page holds {}", page[0]);
        }
    }
}
