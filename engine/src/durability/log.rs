//! [`Log`]: one node's write-ahead log in memory, and its flushes.
//!
//! The log is a ring of [`AtomicU64`] words addressed by *log sequence number* (LSN: a byte
//! position in the endless log stream, always a multiple of 8). A writer encodes a *chunk*
//! (one or more records that recovery replays all or nothing) in its own buffer, reserves room
//! with one compare-and-swap on `tail` (no lock), copies the chunk in and marks it complete by
//! storing its header word last. Reservation order is log order: a worker reserves while it
//! still holds the latches of the pages its chunk changes, so the chunks of one page are in
//! the order of its changes, and every prefix of the log is a state the pages went through
//! together.
//!
//! A flush copies the complete chunks that follow the durable ones into a stream padded to a
//! whole block and hands it to the store's [`LogFile`], which stamps, writes and syncs it.
//! Whoever needs durability flushes (a committing worker, the provider before a write-back,
//! the log writer thread): the flush lock is the group-commit queue, and the leader flushes
//! everything complete, for the whole queue. Flushes never overlap.
//!
//! **Checkpoint epochs.** [`Log::begin_checkpoint`] appends a checkpoint record at LSN `C`
//! and, in the same compare-and-swap, starts a new epoch: a page changed for the first time
//! since `C` is logged as a whole image (see [`Log::append`]). [`Log::finish_checkpoint`]
//! moves the redo and keep points once every page dirty at `C` is durable in the store.
//!
//! It must not know about frames, latches or pages: the callers tell it what to append.

use crate::buffer::page::Changed;
use crate::stats::LogStats;
use parking_lot::{Condvar, Mutex};
use shoal_storage::wal::{
    chunk_size, chunk_word1, rec, LogFile, RedoPoint, SectorBuf, CHUNK_HEADER, IMAGE_RECORD, SBLOCK,
};
use shoal_storage::{SlotChange, SlotLog, StoreError, StoreResult, PAGE_DATA_SIZE};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// LSNs occupy the low 48 bits of the tail word, the checkpoint epoch the high 16.
const LSN_BITS: u32 = 48;
const LSN_MASK: u64 = (1 << LSN_BITS) - 1;
const _: () = assert!(
    LSN_MASK == shoal_storage::wal::MAX_LSN,
    "the file's LSN limit"
);
/// How long a flush waits for a checkpoint to free log space before it reports the log full.
const FULL_WAIT: Duration = Duration::from_secs(30);

/// The flusher's state (under the flush lock, the group-commit queue).
struct Flusher {
    /// LSN of the next chunk to copy out of the ring.
    next: u64,
    /// Stream position (since the log's start, never wrapping) of the next block to write.
    fpos: u64,
    /// The redo point: where replaying pages begins.
    redo: RedoPoint,
    /// The keep point (<= redo): the data area before it may be overwritten. This build
    /// keeps it at the redo point (it has no undo records to keep readable); the header
    /// keeps both, as logs of older builds may have them apart.
    keep: RedoPoint,
    /// The last checkpoint record copied out: (lsn, fpos, flush).
    last_checkpoint: Option<RedoPoint>,
    /// The number the next flush takes (one more per flush, over the log's life).
    flush: u64,
    /// The flush being gathered: its stream (chunks and padding).
    out: SectorBuf,
    /// Checkpoints that failed so far, and why the last one did (`Log::wait_for_room`).
    checkpoint_failures: (u64, String),
}

/// One node's write-ahead log.
pub(crate) struct Log {
    file: LogFile,
    ring: Box<[AtomicU64]>,
    ring_bytes: u64,
    /// epoch << 48 | next free LSN.
    tail: AtomicU64,
    /// LSN of the latest checkpoint begun: a page whose last logged change is older is logged
    /// whole on its next change.
    checkpoint_start: AtomicU64,
    /// Ring space before this LSN is free (copied out and zeroed).
    released: AtomicU64,
    /// Every chunk before this LSN is durable.
    durable: AtomicU64,
    flusher: Mutex<Flusher>,
    /// Wakes flushes waiting for log space after a checkpoint.
    space: Condvar,
    /// A write or sync failed: nothing after the durable point can be promised any more.
    failed: AtomicBool,
    /// The log writer ([`Log::run_writer`]) is about to sleep: a writer placing a chunk wakes it.
    writer_idle: AtomicBool,
    writer_stop: AtomicBool,
    /// A waiter asked the writer not to let commits gather before its next flush (`hurry`).
    hurried: AtomicBool,
    /// Lock and condition of the writer's sleep (the lock guards nothing else).
    writer_sleep: Mutex<()>,
    writer_wake: Condvar,
    /// The log is used beyond [`Log::admit_limit`]: new changes wait for a checkpoint.
    tight: AtomicBool,
    /// Bytes in use ([`Log::used_bytes`]), set with `tight`.
    used: AtomicU64,
    pub stats: LogStats,
    /// Where tests stop a thread between two steps of the log (see [`Pauses`]).
    #[cfg(test)]
    pub(crate) pauses: Mutex<Pauses>,
}

/// A test's hook, run by the thread that reaches its point.
#[cfg(test)]
pub(crate) type Hook = std::sync::Arc<dyn Fn() + Send + Sync>;

/// Points inside the log's lock-free steps where a test runs a hook of its own, to put one
/// thread exactly between two steps of another.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Pauses {
    /// In `place`: a chunk is reserved and copied in, its mark not yet stored.
    pub before_mark: Option<Hook>,
    /// In `flush_locked`: copying chunks out stopped; why is decided next.
    pub copy_stopped: Option<Hook>,
}

impl Log {
    /// Run the hook a test set at a point (the calls exist only in tests).
    #[cfg(test)]
    fn pause(&self, at: impl Fn(&Pauses) -> Option<Hook>) {
        let hook = at(&self.pauses.lock());
        if let Some(h) = hook {
            h();
        }
    }
}

/// Whether a flush whose stream ends at `end` (before its last block's padding) leaves the
/// bytes from the keep point `keep` on alone in a data area of `cap` stream bytes (a multiple
/// of the block). A flush writes whole blocks: the block holding the keep point also holds the
/// first bytes that must stay readable, so the flush must end before that block's next lap.
fn stays_behind_keep(end: u64, keep: u64, cap: u64) -> bool {
    debug_assert!(cap.is_multiple_of(SBLOCK));
    end.next_multiple_of(SBLOCK) <= keep / SBLOCK * SBLOCK + cap
}

fn join(epoch: u64, lsn: u64) -> u64 {
    debug_assert!(lsn <= LSN_MASK);
    (epoch << LSN_BITS) | lsn
}

fn split(t: u64) -> (u64, u64) {
    (t >> LSN_BITS, t & LSN_MASK)
}

impl Log {
    /// The log over `file`, appending where the file says this run begins.
    pub fn new(file: LogFile) -> Log {
        let start = file.start();
        let ring_bytes = file.ring_bytes();
        assert!(ring_bytes.is_power_of_two(), "the ring is a power of two");
        assert!(
            start.lsn.is_multiple_of(8) && start.lsn > 0,
            "a chunk-aligned start"
        );
        Log {
            ring: (0..ring_bytes / 8).map(|_| AtomicU64::new(0)).collect(),
            ring_bytes: ring_bytes as u64,
            tail: AtomicU64::new(join(0, start.lsn)),
            checkpoint_start: AtomicU64::new(start.lsn),
            released: AtomicU64::new(start.lsn),
            durable: AtomicU64::new(start.lsn),
            flusher: Mutex::new(Flusher {
                next: start.lsn,
                fpos: start.fpos,
                redo: start,
                keep: start,
                last_checkpoint: None,
                flush: start.flush + 1,
                out: file.flush_buffer(),
                checkpoint_failures: (0, String::new()),
            }),
            file,
            space: Condvar::new(),
            failed: AtomicBool::new(false),
            tight: AtomicBool::new(false),
            used: AtomicU64::new(0),
            writer_idle: AtomicBool::new(false),
            writer_stop: AtomicBool::new(false),
            hurried: AtomicBool::new(false),
            writer_sleep: Mutex::new(()),
            writer_wake: Condvar::new(),
            stats: LogStats::default(),
            #[cfg(test)]
            pauses: Mutex::new(Pauses::default()),
        }
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Every chunk before this LSN is durable.
    pub fn durable(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    /// The next LSN to be handed out.
    pub fn tail(&self) -> u64 {
        split(self.tail.load(Ordering::Acquire)).1
    }

    /// Used bytes beyond which new changes wait for a checkpoint: the rest (twice the ring)
    /// is room for what is in the ring and the groups already begun, so that a checkpoint can
    /// always flush what the pages it writes need and finish.
    fn admit_limit(&self) -> u64 {
        let cap = self.file.capacity();
        cap - (2 * self.ring_bytes).min(cap / 2)
    }

    /// The log is nearly full: a worker about to begin a change (holding no exclusive latch)
    /// should [`Log::wait_for_room`] first.
    pub fn tight(&self) -> bool {
        self.tight.load(Ordering::Acquire)
    }

    /// Wait until a checkpoint made room (at most 30 s, then [`StoreError::LogFull`]). A
    /// checkpoint that fails meanwhile ends the wait with [`StoreError::CheckpointFailed`] and
    /// its cause (a cluster's dead peer fails every one: no use waiting 30 s for each change).
    pub fn wait_for_room(&self) -> StoreResult<()> {
        let deadline = Instant::now() + FULL_WAIT;
        let mut f = self.flusher.lock();
        let failures = f.checkpoint_failures.0;
        self.stats.full_waits.fetch_add(1, Ordering::Relaxed);
        while self.tight() {
            if self.failed.load(Ordering::Acquire) {
                return Err(self.failure());
            }
            let (count, why) = &f.checkpoint_failures;
            if *count > failures {
                return Err(StoreError::CheckpointFailed {
                    path: self.path().to_path_buf(),
                    why: why.clone(),
                });
            }
            if self.space.wait_until(&mut f, deadline).timed_out() && self.tight() {
                return Err(StoreError::LogFull {
                    path: self.path().to_path_buf(),
                    bytes: self.file.data_bytes(),
                });
            }
        }
        Ok(())
    }

    /// Bytes of the data area in use (from the keep point to the last flush; a lock-free
    /// copy updated by flushes and checkpoints).
    pub fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Record the bytes in use (under the flusher lock): `tight` follows.
    fn set_used(&self, used: u64) {
        assert!(
            used <= self.file.capacity(),
            "the log overwrote its keep point"
        );
        self.used.store(used, Ordering::Relaxed);
        self.tight
            .store(used > self.admit_limit(), Ordering::Release);
    }

    /// A checkpoint failed with `why`: whoever waits for room (and would wait for it in vain
    /// until a retry succeeds) is told at once.
    pub fn checkpoint_failed(&self, why: String) {
        {
            // under the flusher lock: a waiter checks the count and sleeps under it, so it
            // either sees the new count or is asleep when the notification comes
            let mut f = self.flusher.lock();
            f.checkpoint_failures.0 += 1;
            f.checkpoint_failures.1 = why;
        }
        self.space.notify_all();
    }

    /// About how many bytes appends can still take before the log is full: the data area
    /// less what is in use, what was appended but not flushed yet, and the largest chunk
    /// (a margin for appends that run meanwhile).
    pub fn free_bytes(&self) -> u64 {
        let unflushed = self.tail().saturating_sub(self.durable());
        self.file
            .capacity()
            .saturating_sub(self.used_bytes() + unflushed + self.ring_bytes / 4)
    }

    /// Bytes of the data area.
    pub fn capacity_bytes(&self) -> u64 {
        self.file.capacity()
    }

    /// Append one chunk. `encode(c, buf)` writes its records into `buf` (empty on each call),
    /// given `c`, the LSN of the latest checkpoint begun: a page whose last logged change is
    /// before `c` must be logged whole. It is called again if a checkpoint begins before the
    /// chunk is placed. Returns the chunk's LSN and the LSN just past it: (start, end).
    /// The LSN of the latest checkpoint begun (see the field).
    pub fn checkpoint_start(&self) -> u64 {
        self.checkpoint_start.load(Ordering::Acquire)
    }

    pub fn append(
        &self,
        buf: &mut Vec<u8>,
        encode: impl FnMut(u64, &mut Vec<u8>),
    ) -> StoreResult<(u64, u64)> {
        self.place(buf, encode, false)
    }

    fn place(
        &self,
        buf: &mut Vec<u8>,
        mut encode: impl FnMut(u64, &mut Vec<u8>),
        new_epoch: bool,
    ) -> StoreResult<(u64, u64)> {
        if self.failed.load(Ordering::Acquire) {
            return Err(self.failure());
        }
        let mut encoded_for: Option<u64> = None;
        loop {
            // Acquire pairs with the Release of the compare-and-swap that began the current
            // epoch, after which `checkpoint_start` holds that epoch's start (or a later one,
            // which only logs more whole images).
            let t = self.tail.load(Ordering::Acquire);
            let (epoch, lsn) = split(t);
            if encoded_for != Some(epoch) {
                buf.clear();
                encode(self.checkpoint_start.load(Ordering::Acquire), buf);
                encoded_for = Some(epoch);
            }
            let len = buf.len();
            let size = chunk_size(len);
            if size > self.ring_bytes / 4 || size > self.file.capacity() / 4 {
                // (what the guards held at once log: their pages' changes)
                return Err(StoreError::BadLog {
                    path: self.path().to_path_buf(),
                    why: format!(
                        "a log chunk of {size} bytes is larger than a quarter of the ring ({} \
                         bytes) or of the log ({} bytes): log less under one guard, or give \
                         the log more room",
                        self.ring_bytes,
                        self.file.capacity()
                    ),
                });
            }
            if lsn + size > self.released.load(Ordering::Acquire) + self.ring_bytes {
                self.flush_some()?;
                continue;
            }
            let next_epoch = if new_epoch {
                // publish the new epoch's start before the epoch (Release below)
                self.checkpoint_start.fetch_max(lsn, Ordering::AcqRel);
                (epoch + 1) & 0xffff
            } else {
                epoch
            };
            // SeqCst (on x86 the same instruction as AcqRel): with the SeqCst load of
            // `writer_idle` in `wake_writer`, see `run_writer`.
            if self
                .tail
                .compare_exchange_weak(
                    t,
                    join(next_epoch, lsn + size),
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                )
                .is_err()
            {
                continue;
            }
            // The range [lsn, lsn + size) is ours; `released` showed it copied out and zeroed.
            let w1 = chunk_word1(buf);
            buf.resize((size - CHUNK_HEADER) as usize, 0);
            self.put_word(lsn + 8, w1);
            self.copy_in(lsn + CHUNK_HEADER, buf);
            #[cfg(test)]
            self.pause(|p| p.before_mark.clone());
            // Release: the flusher that reads this mark (Acquire) sees the words above.
            self.word(lsn).store(lsn, Ordering::Release);
            self.stats.chunks.fetch_add(1, Ordering::Relaxed);
            self.wake_writer();
            return Ok((lsn, lsn + size));
        }
    }

    fn word(&self, lsn: u64) -> &AtomicU64 {
        &self.ring[((lsn % self.ring_bytes) / 8) as usize]
    }

    /// Copy `bytes` (a multiple of 8) into the ring at `lsn`, wrapping at its end.
    fn copy_in(&self, lsn: u64, bytes: &[u8]) {
        debug_assert!(bytes.len().is_multiple_of(8));
        let start = ((lsn % self.ring_bytes) / 8) as usize;
        let words = bytes.len() / 8;
        let first = words.min(self.ring.len() - start);
        let (a, b) = bytes.split_at(first * 8);
        for (part, at) in [(a, start), (b, 0)] {
            let dst = &self.ring[at..at + part.len() / 8];
            // SAFETY: these words belong to this thread's reserved chunk and are not its mark:
            // no thread reads or writes them until the mark is stored (Release, afterwards),
            // so plain writes to the `AtomicU64`s (same layout as u64) race with nothing.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    part.as_ptr(),
                    dst.as_ptr().cast::<u8>().cast_mut(),
                    part.len(),
                )
            };
        }
    }

    fn put_word(&self, lsn: u64, v: u64) {
        self.word(lsn).store(v, Ordering::Relaxed);
    }

    /// Make everything before `lsn` durable (group commit: one caller flushes for all).
    /// The log keeps room for what the provider's write-backs (checkpoints among them) need
    /// flushed: see [`Log::tight`].
    pub fn flush_to(&self, lsn: u64) -> StoreResult<()> {
        let t0 = Instant::now();
        while self.durable() < lsn {
            if self.failed.load(Ordering::Acquire) {
                return Err(self.failure());
            }
            let mut f = self.flusher.lock();
            if self.durable() >= lsn {
                break;
            }
            if !self.flush_locked(&mut f)? {
                // a chunk before `lsn` is still being copied in: its writer finishes shortly
                drop(f);
                if t0.elapsed() > Duration::from_millis(1) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        Ok(())
    }

    /// Flush whatever is complete (for ring space and the timed flush).
    pub fn flush_some(&self) -> StoreResult<()> {
        let mut f = self.flusher.lock();
        if !self.flush_locked(&mut f)? {
            drop(f);
            std::thread::yield_now();
        }
        Ok(())
    }

    /// The log writer's loop, on a thread of its own until [`Log::stop_writer`]: with `every`,
    /// flush whatever is complete once per interval (durability `flush-every-ms`); without,
    /// flush as soon as anything is complete (durability `commit`: one flush after another,
    /// each taking every chunk placed while the previous one ran; workers that committed
    /// without waiting see [`Log::durable`] pass their point). Sleeps while the ring is empty.
    /// Returns the first error (the log is then failed for everyone).
    pub fn run_writer(&self, every: Option<Duration>) -> StoreResult<()> {
        const NAP: Duration = Duration::from_millis(1);
        const GATHER: Duration = Duration::from_micros(200);

        let mut next_tick = Instant::now();
        while !self.writer_stop.load(Ordering::Acquire) {
            if let Some(every) = every {
                next_tick += every;
                let now = Instant::now();
                if next_tick > now {
                    let mut g = self.writer_sleep.lock();
                    if !self.writer_stop.load(Ordering::Acquire) {
                        self.writer_wake.wait_for(&mut g, next_tick - now);
                    }
                } else {
                    next_tick = now;
                }
                self.flush_complete()?;
                continue;
            }
            if self.flush_complete()? {
                // let commits gather: fewer, larger flushes (measured on a 2-core VM: 1,400
                // instead of 3,500 flushes/s and 6% more YCSB-A throughput, +60 us median
                // latency). A thread waiting in `flush_to` flushes itself, not after this;
                // a page waiting to leave the node cuts the gathering short (`hurry`).
                let mut g = self.writer_sleep.lock();
                if !self.hurried.swap(false, Ordering::AcqRel)
                    && !self.writer_stop.load(Ordering::Acquire)
                {
                    self.writer_wake.wait_for(&mut g, GATHER);
                }
                self.hurried.store(false, Ordering::Relaxed);
                continue;
            }
            // Sleep only while nothing is reserved beyond what was copied out. No lost wake-up:
            // this SeqCst store of `writer_idle` and the SeqCst load of the tail below, against
            // a placer's SeqCst compare-and-swap of the tail and its SeqCst load of
            // `writer_idle` (`wake_writer`): either we see its reservation or it sees us idle,
            // and it notifies holding `writer_sleep`, which we hold from the check to the wait.
            // (A reservation still being copied in: yield until it is complete.)
            self.writer_idle.store(true, Ordering::SeqCst);
            {
                let mut g = self.writer_sleep.lock();
                let reserved = split(self.tail.load(Ordering::SeqCst)).1;
                if reserved == self.released.load(Ordering::Acquire)
                    && !self.writer_stop.load(Ordering::Acquire)
                {
                    self.writer_wake.wait_for(&mut g, NAP);
                } else if !self.has_complete_chunk() {
                    drop(g);
                    std::thread::yield_now();
                }
            }
            self.writer_idle.store(false, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Wake the log writer if it sleeps (after a reservation: see `run_writer`).
    fn wake_writer(&self) {
        if self.writer_idle.load(Ordering::SeqCst) {
            let _g = self.writer_sleep.lock();
            self.writer_wake.notify_one();
        }
    }

    /// Someone waits for the next flush (a page that may leave the node only once its changes
    /// are durable): the log writer flushes without first letting commits gather.
    pub fn hurry(&self) {
        if !self.hurried.swap(true, Ordering::AcqRel) {
            let _g = self.writer_sleep.lock();
            self.writer_wake.notify_one();
        }
    }

    /// Make [`Log::run_writer`] return (after its current flush).
    pub fn stop_writer(&self) {
        self.writer_stop.store(true, Ordering::Release);
        let _g = self.writer_sleep.lock();
        self.writer_wake.notify_all();
    }

    /// The chunk after the last one copied out is complete.
    fn has_complete_chunk(&self) -> bool {
        // Acquire: as in `flush_locked`, which reads the chunk after this says it is there.
        let next = self.released.load(Ordering::Acquire);
        self.word(next).load(Ordering::Acquire) == next
    }

    /// Flush the complete chunks, if any; returns whether anything was written.
    fn flush_complete(&self) -> StoreResult<bool> {
        if !self.has_complete_chunk() {
            return Ok(false);
        }
        let mut f = self.flusher.lock();
        self.flush_locked(&mut f)
    }

    /// Everything appended so far is durable.
    pub fn flush_all(&self) -> StoreResult<()> {
        self.flush_to(self.tail())
    }

    /// Most pages one chunk can hold, each logged whole or as a diff of the most ranges
    /// ([`Changed::MAX`]) at worst: a chunk takes at most a quarter of the ring and of the
    /// log (see `place`).
    pub fn most_pages_per_chunk(&self) -> usize {
        let room = (self.ring_bytes / 4).min(self.file.capacity() / 4);
        // a diff record: kind, slot, pid, version, count, then 4 bytes before each range
        let diff = 1 + 24 + 2 + 4 * Changed::MAX + PAGE_DATA_SIZE;
        let page = diff.max(IMAGE_RECORD) as u64;
        (room.saturating_sub(CHUNK_HEADER + 8) / page) as usize
    }

    /// Take no more changes: a change of pages was made but could not be logged (so no later
    /// change of them may be logged either). Every append, flush and wait for room fails
    /// from now on, as after a failed write.
    pub fn fail(&self) {
        {
            // under the flusher lock: a waiter checks `failed` and sleeps under it, so it
            // either sees the flag or is asleep when the notification comes
            let _f = self.flusher.lock();
            self.failed.store(true, Ordering::Release);
        }
        self.space.notify_all();
    }

    /// An error if a write or sync of the log failed (nothing more can be made durable).
    pub fn check_failed(&self) -> StoreResult<()> {
        if self.failed.load(Ordering::Acquire) {
            return Err(self.failure());
        }
        Ok(())
    }

    fn failure(&self) -> StoreError {
        StoreError::BadLog {
            path: self.path().to_path_buf(),
            why: "an earlier log write failed: nothing after the last durable point can be made \
                  durable (see the first error)"
                .into(),
        }
    }

    /// Copy the complete chunks after `f.next` out of the ring and write them durably, as
    /// flush number `f.flush`. Returns whether anything was written.
    fn flush_locked(&self, f: &mut parking_lot::MutexGuard<'_, Flusher>) -> StoreResult<bool> {
        let cap = self.file.capacity();
        let start_lsn = f.next;
        let start_fpos = f.fpos;
        assert!(
            start_fpos.is_multiple_of(SBLOCK),
            "a flush starts on a block of the stream"
        );
        assert!(start_lsn <= self.tail(), "the flusher is behind the tail");
        f.out.clear();
        let mut pos = f.fpos; // stream position of the next byte pushed
        let mut lsn = f.next;
        let flush = f.flush;
        // Whether the copying stopped at a complete chunk because the log has no room for it
        // (decided here, where it stopped: re-reading the mark afterwards would mistake a
        // chunk completed meanwhile for a full log)
        let mut full = false;
        loop {
            // Acquire pairs with the writer's Release of the mark: the chunk's words are visible.
            if self.word(lsn).load(Ordering::Acquire) != lsn {
                break;
            }
            let w1 = self.word(lsn + 8).load(Ordering::Relaxed);
            let len = (w1 & 0xffff_ffff) as usize;
            let size = chunk_size(len);
            let wrap = if pos % cap + size > cap {
                cap - pos % cap // no room before the end of the data area: go on from its start
            } else {
                0
            };
            if wrap + size + SBLOCK > f.out.room() {
                break; // the rest in the next flush (the last block's padding fits)
            }
            if !stays_behind_keep(pos + wrap + size, f.keep.fpos, cap) {
                full = true; // the log is full up to the keep point
                break;
            }
            if wrap > 0 {
                f.out.pad(&mut pos, wrap);
            }
            self.copy_out(lsn, size, &mut f.out);
            if len > 0
                && (self.word(lsn + CHUNK_HEADER).load(Ordering::Relaxed) & 0xff) as u8
                    == rec::CHECKPOINT
            {
                f.last_checkpoint = Some(RedoPoint {
                    lsn,
                    fpos: pos,
                    flush,
                });
            }
            pos += size;
            lsn += size;
        }
        #[cfg(test)]
        self.pause(|p| p.copy_stopped.clone());
        if lsn == start_lsn {
            if full {
                // the next chunk is complete but the log has no room: wait for a checkpoint
                self.stats.full_waits.fetch_add(1, Ordering::Relaxed);
                let deadline = Instant::now() + FULL_WAIT;
                let keep = f.keep;
                return if self.wait_space(f, keep, deadline) {
                    Ok(true)
                } else {
                    self.failed.store(true, Ordering::Release);
                    Err(StoreError::LogFull {
                        path: self.path().to_path_buf(),
                        bytes: self.file.data_bytes(),
                    })
                };
            }
            return Ok(false);
        }
        // Free the ring range for writers: zero it (so no stale word looks like a mark), then
        // publish with Release (writers Acquire `released` before reusing it).
        let mut z = start_lsn;
        while z < lsn {
            self.word(z).store(0, Ordering::Relaxed);
            z += 8;
        }
        self.released.store(lsn, Ordering::Release);
        let rem = (SBLOCK - pos % SBLOCK) % SBLOCK;
        if rem > 0 {
            f.out.pad(&mut pos, rem);
        }
        let (written, took) = match self.file.write_flush(&mut f.out, start_fpos, flush) {
            Ok(r) => r,
            Err(e) => {
                self.failed.store(true, Ordering::Release);
                return Err(e);
            }
        };
        let st = &self.stats;
        let took = took.as_nanos() as u64;
        st.sync_nanos.fetch_add(took, Ordering::Relaxed);
        st.sync_max_nanos.fetch_max(took, Ordering::Relaxed);
        st.flushes.fetch_add(1, Ordering::Relaxed);
        st.bytes_written.fetch_add(written, Ordering::Relaxed);
        f.next = lsn;
        f.fpos = pos;
        f.flush += 1;
        self.set_used(f.fpos - f.keep.fpos);
        // Release: whoever reads the new durable point may act on it (write pages back, ack).
        self.durable.store(lsn, Ordering::Release);
        Ok(true)
    }

    /// Copy the complete chunk of `size` bytes at `lsn` out of the ring into `out`.
    fn copy_out(&self, lsn: u64, size: u64, out: &mut SectorBuf) {
        let start = ((lsn % self.ring_bytes) / 8) as usize;
        let words = (size / 8) as usize;
        let first = words.min(self.ring.len() - start);
        for part in [
            &self.ring[start..start + first],
            &self.ring[..words - first],
        ] {
            let n = part.len() * 8;
            // SAFETY: the chunk is complete (its mark was read with Acquire, after its writer's
            // Release), and no thread writes these words until `released` passes them, which
            // only this flush (holding the flusher lock) does afterwards: plain reads of the
            // `AtomicU64`s (same layout as u64) race with no write. Other threads may only
            // read them (mark checks), and reads do not race with reads.
            let src = unsafe { std::slice::from_raw_parts(part.as_ptr().cast::<u8>(), n) };
            out.push(src);
        }
    }

    fn wait_space(
        &self,
        f: &mut parking_lot::MutexGuard<'_, Flusher>,
        keep: RedoPoint,
        deadline: Instant,
    ) -> bool {
        log::warn!(
            "{}: the log is full ({} MiB since the last checkpoint); waiting for a checkpoint",
            self.path().display(),
            self.file.data_bytes() >> 20
        );
        while f.keep == keep {
            if self.space.wait_until(f, deadline).timed_out() {
                return f.keep != keep;
            }
        }
        true
    }

    /// Begin a checkpoint: append its record at LSN `C` and start a new epoch (pages changed
    /// after `C` are logged whole once). Returns `C`. The caller then writes back every page
    /// dirty now, syncs the store and calls [`Log::finish_checkpoint`] with `C`.
    pub fn begin_checkpoint(&self) -> StoreResult<u64> {
        let mut buf = Vec::with_capacity(8);
        let (c, end) = self.place(&mut buf, |_, b| b.push(rec::CHECKPOINT), true)?;
        // SeqCst fence: the checkpoint's start (`checkpoint_start`, set in `place`) is
        // published before the caller looks for dirty frames; paired with the fence in
        // `Coherence::relog_received` (engine/src/coherence/logged.rs)
        std::sync::atomic::fence(Ordering::SeqCst);
        self.flush_to(end)?;
        Ok(c)
    }

    /// Finish the checkpoint begun at `c`: every page changed before `c` is durable in the
    /// store. Writes `alloc` (the allocator as it is now; allocations logged before now are in
    /// it, and replaying them again is harmless) and a header naming `c` as the redo start
    /// and the keep point: the log before `c` may be overwritten.
    pub fn finish_checkpoint(&self, c: u64, alloc: &shoal_storage::Allocator) -> StoreResult<()> {
        let (redo, keep) = {
            let f = self.flusher.lock();
            let redo = match f.last_checkpoint {
                Some(r) if r.lsn == c => r,
                _ => {
                    return Err(StoreError::BadLog {
                        path: self.path().to_path_buf(),
                        why: format!("checkpoint {c} is not the last one written"),
                    })
                }
            };
            // nothing before the checkpoint is needed again: the pages changed before it are
            // in the store, and no record is ever undone
            (redo, redo)
        };
        // the next flush's number, read now: the header promises a number past every flush
        // written before it (later flushes only make the promise more true)
        let next_flush = self.flusher.lock().flush;
        self.file.write_header(redo, keep, alloc, next_flush)?;
        {
            let mut f = self.flusher.lock();
            assert!(keep.fpos >= f.keep.fpos, "the keep point never moves back");
            f.redo = redo;
            f.keep = keep;
            self.set_used(f.fpos - f.keep.fpos);
        }
        self.space.notify_all();
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("path", &self.path())
            .field("durable", &self.durable())
            .finish()
    }
}

/// The store records its allocations and frees here (under its allocator's lock).
impl SlotLog for Log {
    fn record(&self, change: SlotChange) -> StoreResult<()> {
        let (kind, slot) = match change {
            SlotChange::Allocated(s) => (rec::ALLOC, s),
            SlotChange::Freed(s) => (rec::FREE, s),
        };
        let mut buf = Vec::with_capacity(16);
        self.append(&mut buf, |_, b| {
            b.push(kind);
            b.extend_from_slice(&slot.to_le_bytes());
        })
        .map(|_| ())
    }
}
