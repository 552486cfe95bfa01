//! The page provider: keeps free frames available by evicting cold pages (LRU by access
//! clock: the "epoch LRU" of the papers, whose epoch is called the clock here so that
//! "epoch" keeps one meaning, the coherence protocol's conflict epoch).
//!
//! One provider thread per node. Each round, while fewer than `free_target` frames are free:
//!
//! 1. **Sample** up to [`SAMPLE`] random resident frames and take the 10th-percentile
//!    last-used clock value as the cut-off: frames last touched at or before it are cold.
//!    A cluster node in one pool (`EngineConfig::one_pool`) whose sample holds at least
//!    [`FOREIGN_SHARE_SAMPLES`] copies of other homes' pages takes the cut-off among those
//!    and evicts only them this round: its own pages may be the cluster's last DRAM copy
//!    (unless a home declined one of its eviction notices since the last round: a declined
//!    copy stays, and a cache full of them would free nothing; the round is then a plain
//!    LRU one).
//! 2. **Scan** frames from a clock hand for unlatched cold frames, up to a batch of [`BATCH`].
//! 3. **Evict the clean ones** at once (step 5 for each): they need no write, so the frames
//!    they free do not wait for the device.
//! 4. **Write back** dirty candidates: under the shared latch (no writer can be active) copy the
//!    page into an aligned buffer and clear the dirty flag; write the batch (`pwrite` one
//!    page after another: see `PageStore::write_batch` for why not io_uring); on failure set
//!    the page dirty again (it stays in
//!    memory: nothing is lost) and remember the error for starving faults to report.
//! 5. **Evict**: try the exclusive latch (never wait); if the page was dirtied again meanwhile, or
//!    someone holds it, skip it; else unlink it from the table, bump the version and queue the
//!    frame as free.
//! 6. Advance the access clock every `frames / 128` evictions, so access recency keeps its
//!    resolution as pages cycle through the cache.
//!
//! Fixed pages (shared or exclusive guard held) are never evicted: step 2 skips latched frames
//! and step 5 only uses `try` latches.
//!
//! Why clean pages go before the write (step 3): a write-back batch can be slow (on cluster
//! nodes under saturated CPU, io_uring writes of ten pages took 1.7 to 30 s, see
//! docs/cluster.md "Stalls under load"; writes now go through pwrite), and until it is
//! written a round that frees nothing leaves arriving pages without a frame.

use crate::buffer::FrameIdx;
use crate::error::EngineError;
use crate::node::Node;
use crate::pid::Pid;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shoal_storage::wal::put_image;
use shoal_storage::{AlignedPage, WriteRequest, PAGE_DATA_SIZE, PAGE_SIZE};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long after a failed checkpoint the provider tries the next.
const CHECKPOINT_RETRY: Duration = Duration::from_secs(1);

/// Frames sampled per round to find the cut-off.
pub const SAMPLE: usize = 64;
/// Most pages evicted (and written) per round.
pub const BATCH: usize = 128;
/// One pool: how often a cluster node tells its peers its room (frames it could take in).
pub const ROOM_INTERVAL: Duration = Duration::from_millis(20);
/// One pool: copies of other homes' pages are evicted before this node's own pages while at
/// least this many of the [`SAMPLE`] sampled frames hold them (4 of 64: about 6% of the cache).
pub const FOREIGN_SHARE_SAMPLES: usize = SAMPLE / 16;
/// Write-back errors are logged at most once per this interval (with a count of the ones not
/// logged): a full or failing device fails every write-back of every round, and one line per
/// page would bury everything else in the log.
pub const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Longest pause between rounds whose write-backs all fail (the pause doubles from 1 ms).
const MAX_FAILING_PAUSE: Duration = Duration::from_millis(100);
/// A write-back batch slower than this is logged (at most once per [`ERROR_LOG_INTERVAL`]):
/// a device this slow holds up the frames of dirty pages, and remote waits in a cluster.
const SLOW_WRITE: Duration = Duration::from_secs(1);

/// Logs the first error of a kind, then at most one line per [`ERROR_LOG_INTERVAL`] saying how
/// many more there were.
pub(crate) struct ErrorLog {
    what: &'static str,
    last: Option<Instant>,
    unlogged: u64,
}

impl ErrorLog {
    pub(crate) fn new(what: &'static str) -> Self {
        ErrorLog {
            what,
            last: None,
            unlogged: 0,
        }
    }

    /// Record one failure; logs it if the interval has passed.
    pub(crate) fn error(&mut self, pid: Pid, e: &dyn std::fmt::Display) {
        match self.due(Instant::now()) {
            None => {}
            Some(0) => log::error!("{} page {pid} failed: {e}", self.what),
            Some(n) => log::error!(
                "{} page {pid} failed: {e} ({n} more failures since the last report)",
                self.what
            ),
        }
    }

    /// Count a failure at `now`: `Some(failures not logged before it)` if this one is to be
    /// logged, `None` if it is only counted.
    fn due(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < ERROR_LOG_INTERVAL)
        {
            self.unlogged += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }

    /// Failures recorded but not logged yet.
    pub(crate) fn unlogged(&self) -> u64 {
        self.unlogged
    }
}

/// The provider thread's main loop.
pub(crate) fn run(node: Arc<Node>) {
    let buf = &node.buffer();
    let mut p = Provider {
        slow: ErrorLog::new("slow write-back"),
        rng: SmallRng::seed_from_u64(0x5EED ^ buf.node as u64),
        hand: 0,
        bufs: (0..BATCH).map(|_| AlignedPage::new()).collect(),
        since_tick: 0,
        errors: ErrorLog::new("writing back"),
        checkpoint_errors: CheckpointErrors::default(),
        failing_pause: Duration::ZERO,
        declined_seen: 0,
    };
    let mut room_told = Instant::now();
    let mut checkpoint_retry = Instant::now();
    while !buf.is_shutdown() {
        if room_told.elapsed() >= ROOM_INTERVAL {
            node.advertise_room();
            room_told = Instant::now();
        }
        if let Some(ticket) = buf.flushes.pending() {
            let r = p.flush(&node).map_err(|e| e.to_string());
            buf.flushes.served(ticket, r);
        }
        if node.log().is_some_and(|l| l.wants_checkpoint()) && Instant::now() >= checkpoint_retry {
            if let Err(e) = p.checkpoint(&node) {
                p.checkpoint_errors.error(&e);
                if let Some(log) = node.log() {
                    log.log().checkpoint_failed(e.to_string());
                }
                // (a cluster node's checkpoint waits for its peers: one that failed, for a
                // peer that died or did not answer, is tried again a little later)
                checkpoint_retry = Instant::now() + CHECKPOINT_RETRY;
            }
        }
        if buf.free.len() >= buf.free_target {
            buf.wait_for_demand(Duration::from_millis(10));
            continue;
        }
        let freed = p.round(&node);
        buf.counters.provider_rounds.fetch_add(1, Ordering::Relaxed);
        if freed > 0 {
            buf.frames_were_freed();
        } else if !p.failing_pause.is_zero() {
            // Every write-back of the round failed: the device is full or failing. Retry
            // ever more slowly (the pages stay dirty in memory; a freed device takes them).
            std::thread::sleep(p.failing_pause);
        } else {
            // Nothing evictable right now (all fixed): do not spin.
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    if p.errors.unlogged() > 0 {
        log::error!(
            "{} more write-backs failed after the last report",
            p.errors.unlogged()
        );
    }
}

/// Failed checkpoints, reported at most once every 10 s (a cluster node whose peer died
/// fails every try: its log fence is never answered).
#[derive(Default)]
struct CheckpointErrors {
    last: Option<Instant>,
    since: u64,
}

impl CheckpointErrors {
    fn error(&mut self, e: &EngineError) {
        self.since += 1;
        if self
            .last
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            log::error!(
                "a checkpoint failed ({} since the last report): {e}; the log keeps everything \
                 since the last checkpoint; once it is nearly full, changes fail with this error",
                self.since
            );
            self.last = Some(Instant::now());
            self.since = 0;
        }
    }
}

struct Provider {
    /// Write-back batches slower than [`SLOW_WRITE`] (rate-limited reports).
    slow: ErrorLog,
    rng: SmallRng,
    hand: usize,
    bufs: Vec<AlignedPage>,
    since_tick: usize,
    errors: ErrorLog,
    checkpoint_errors: CheckpointErrors,
    /// Pause after a round whose write-backs all failed (zero after one that wrote a page).
    failing_pause: Duration,
    /// This node's eviction notices declined by their homes, as of the last round
    /// (`ProtocolStats::evictions_declined`).
    declined_seen: u64,
}

impl Provider {
    /// A checkpoint (docs/durability.md): begin it in the log, write back every page dirty
    /// at its start (`write_back_dirty`), sync, record it.
    fn checkpoint(&mut self, node: &Node) -> Result<(), EngineError> {
        let Some(log) = node.log() else {
            return Ok(());
        };
        if node.coherence().is_some() {
            // The pages of other homes held dirty here are logged whole after the checkpoint's
            // start. Appends that do not fit would wait for room that only this checkpoint
            // makes: fail it instead (an error, tried again a second later).
            let pages = node.foreign_dirty();
            let need =
                pages as u64 * shoal_storage::wal::chunk_size(shoal_storage::wal::IMAGE_RECORD);
            let free = log.log().free_bytes();
            if need > free {
                return Err(EngineError::CheckpointNoRoom {
                    node: node.id(),
                    pages,
                    need_kib: need >> 10,
                    free_kib: free >> 10,
                });
            }
        }
        let c = log.begin_checkpoint()?;
        let t0 = Instant::now();
        let written = self.write_back_dirty(node)?;
        let mut logged = 0;
        let mut all_fenced = true;
        if let Some(coh) = node.coherence() {
            // A cluster node's log also holds changes to pages homed elsewhere, and images of
            // pages that arrived dirty. Before the log before `c` goes: the pages of other
            // homes this node holds dirty are logged whole after `c` (they cannot be written
            // to this store), so are those waiting for a frame, and every peer's log is made
            // durable up to the pages this node handed it; for a dead peer, which cannot
            // answer, this node's records of those pages are carried over (docs/durability.md,
            // "Clusters").
            logged = self.log_foreign_dirty(node)? + coh.log_held_pages()?;
            let dead = coh.fence_logs(node.buffer(), coh.fence_limit())?;
            if !dead.is_empty() {
                coh.carry_for_dead(&dead, c)?;
                all_fenced = false;
            }
        }
        match node.coherence() {
            Some(coh) => coh.finish_checkpoint_unless_recovering(|| {
                log.finish_checkpoint(node.buffer().store(), c, all_fenced)
            })?,
            None => log.finish_checkpoint(node.buffer().store(), c, all_fenced)?,
        }
        log::debug!(
            "node {}: checkpoint at LSN {c}: {written} pages written, {logged} pages of other homes logged whole, in {:.2} s",
            node.id(),
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// A cluster node's checkpoint: log whole every page homed elsewhere that this node holds
    /// dirty (under a shared latch: no change to it can be placed in the log meanwhile, so the
    /// image lands in its order). Latched frames are come back to, as in `write_back_dirty`.
    fn log_foreign_dirty(&mut self, node: &Node) -> Result<u64, EngineError> {
        let (buf, here) = (node.buffer(), node.id());
        let Some(log) = node.log() else {
            return Ok(0);
        };
        let foreign_dirty = |i: FrameIdx| {
            let f = buf.frame(i);
            f.is_resident() && f.is_dirty() && f.pid().node() != here
        };
        let mut todo: Vec<FrameIdx> = buf.frame_indexes().filter(|&i| foreign_dirty(i)).collect();
        let mut logged = 0;
        let mut scratch = Vec::with_capacity(PAGE_SIZE + 64);
        while !todo.is_empty() {
            let mut later = Vec::new();
            for i in todo {
                let Some(s) = buf.try_hold_shared(i) else {
                    later.push(i);
                    continue;
                };
                if !foreign_dirty(i) {
                    continue;
                }
                let (pid, bytes) = (s.frame().pid(), s.bytes());
                let version = shoal_storage::version(bytes);
                log.log().append(&mut scratch, |_, b| {
                    put_image(b, pid.slot(), pid.raw(), version, &bytes[..PAGE_DATA_SIZE])
                })?;
                logged += 1;
            }
            todo = later;
            if !todo.is_empty() {
                if buf.is_shutdown() {
                    // the checkpoint must not end without them (close takes its own)
                    return Err(EngineError::Shutdown);
                }
                if buf.free.len() < buf.free_target {
                    self.round(node);
                    buf.frames_were_freed();
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        Ok(logged)
    }

    /// `Engine::flush`: with a log, a checkpoint; without, every page dirty now written back
    /// and the devices synced.
    fn flush(&mut self, node: &Node) -> Result<(), EngineError> {
        let buf = &node.buffer();
        if node.log().is_some() {
            return self.checkpoint(node);
        }
        let t0 = Instant::now();
        let written = self.write_back_dirty(node)?;
        buf.store().sync()?;
        log::debug!(
            "node {}: flush: {written} pages written in {:.2} s",
            node.id(),
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Write back every page dirty now that is homed here (the write-ahead rule applies; a
    /// cluster node's copies of other homes' pages go home through the protocol, not into this
    /// store). Frames latched by a worker are come back to, with eviction rounds between, so
    /// that a worker that waits for a free frame while holding a latch is not waited for in
    /// turn. Returns the pages written (stops early, successfully, when the buffer shuts
    /// down: close writes the rest).
    fn write_back_dirty(&mut self, node: &Node) -> Result<usize, EngineError> {
        let buf = &node.buffer();
        let here = node.id();
        let mut todo: Vec<FrameIdx> = buf
            .frame_indexes()
            .filter(|&i| {
                let f = buf.frame(i);
                f.is_dirty() && f.pid().node() == here
            })
            .collect();
        // in slot order: the write-backs of a batch of neighbouring slots go out as a few
        // `pwritev` runs (`PageStore::write_batch`; docs/BENCHMARKS.md "Durability")
        todo.sort_unstable_by_key(|&i| buf.frame(i).pid().raw());
        let mut written = 0usize;
        while !todo.is_empty() {
            let mut later = Vec::new();
            let mut k = 0;
            while k < todo.len() {
                let mut pending: Vec<(FrameIdx, Pid)> = Vec::with_capacity(BATCH);
                let mut upto = 0;
                while k < todo.len() && pending.len() < BATCH {
                    let i = todo[k];
                    k += 1;
                    let Some(s) = buf.try_hold_shared(i) else {
                        later.push(i);
                        continue;
                    };
                    let f = s.frame();
                    if f.is_resident() && f.is_dirty() && f.pid().node() == here {
                        self.bufs[pending.len()].copy_from_slice(s.bytes());
                        f.set_dirty(false);
                        upto = upto.max(f.lsn());
                        pending.push((i, f.pid()));
                    }
                }
                let results = write_pages(node, &pending, &mut self.bufs, upto);
                for ((i, pid), r) in pending.iter().zip(results) {
                    match r {
                        Ok(()) => written += 1,
                        Err(e) => {
                            let f = buf.frame(*i);
                            if f.pid() == *pid {
                                f.set_dirty(true);
                            }
                            buf.counters.write_errors.fetch_add(1, Ordering::Relaxed);
                            return Err(e.into());
                        }
                    }
                }
            }
            todo = later;
            if !todo.is_empty() {
                if buf.is_shutdown() {
                    return Ok(written); // close writes everything and checkpoints itself
                }
                if buf.free.len() < buf.free_target {
                    self.round(node);
                    buf.frames_were_freed();
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        Ok(written)
    }

    fn round(&mut self, node: &Node) -> usize {
        let buf = &node.buffer();
        let n = buf.frames();
        // 1. sample (in one pool, the copies of other homes' pages apart)
        let me = node.id();
        let one_pool = node.one_pool();
        let mut sample = Vec::with_capacity(SAMPLE);
        let mut foreign = Vec::with_capacity(SAMPLE);
        for _ in 0..SAMPLE * 4 {
            let f = buf.frame(FrameIdx(self.rng.random_range(0..n) as u32));
            if f.is_resident() {
                sample.push(f.last_used());
                if one_pool && f.pid().node() != me {
                    foreign.push(f.last_used());
                }
                if sample.len() == SAMPLE {
                    break;
                }
            }
        }
        if sample.is_empty() {
            return 0;
        }
        // One pool: while copies of other homes' pages hold more than a small share of the
        // cache, they go first (the coldest of them): their home still has the page (or a
        // sharer does), so dropping one costs a message, while this node's own pages may
        // be the cluster's only DRAM copy and would cost an NVMe read. Below the share, the
        // plain LRU decides, so a node whose own pages overflow it still keeps some of the
        // others' hot pages.
        // (a declined notice leaves its copy here: with only such copies to pick from, a
        // foreign-only round would free nothing, round after round)
        let declined = node.evictions_declined();
        let declines_since = declined > self.declined_seen;
        self.declined_seen = declined;
        let only_foreign = foreign.len() >= FOREIGN_SHARE_SAMPLES && !declines_since;
        let cutoff = if only_foreign {
            foreign.sort_unstable();
            foreign[foreign.len() / 10]
        } else {
            sample.sort_unstable();
            sample[sample.len() / 10]
        };

        // 2. scan
        let want = (buf.free_target * 2)
            .saturating_sub(buf.free.len())
            .clamp(1, BATCH);
        let mut cands: Vec<FrameIdx> = Vec::with_capacity(want);
        let mut scanned = 0;
        while cands.len() < want && scanned < n {
            let i = FrameIdx(self.hand as u32);
            self.hand = (self.hand + 1) % n;
            scanned += 1;
            let f = buf.frame(i);
            if f.is_resident()
                && !f.latch.is_latched()
                && f.last_used() <= cutoff
                && (!only_foreign || f.pid().node() != me)
            {
                cands.push(i);
            }
        }

        // 2b. in a cluster, pages this node holds go through their directory first: a page
        // homed elsewhere leaves by an eviction notice (the handler frees its frame when the
        // home accepts), one homed here is released locally; what remains is plain home
        // copies, evicted below like a single node's pages
        cands.retain(|&i| node.prepare_evict(i));
        // this pass's eviction notices leave in one batch per home
        node.eviction_pass_done();

        // 3. evict the clean candidates now (no write to wait for)
        let mut freed = 0;
        let mut done = vec![false; cands.len()];
        for (k, &i) in cands.iter().enumerate() {
            if !buf.frame(i).is_dirty() {
                done[k] = true;
                freed += usize::from(evict(node, i));
            }
        }

        // 4. write back dirty candidates
        let mut pending: Vec<(FrameIdx, Pid)> = Vec::new();
        let mut upto = 0;
        for (k, &i) in cands.iter().enumerate() {
            if done[k] || !buf.frame(i).is_dirty() {
                continue;
            }
            let Some(s) = buf.try_hold_shared(i) else {
                continue;
            };
            let f = s.frame();
            if f.is_resident() && f.is_dirty() {
                let k = pending.len();
                self.bufs[k].copy_from_slice(s.bytes());
                f.set_dirty(false);
                upto = upto.max(f.lsn());
                pending.push((i, f.pid()));
            }
        }
        if !pending.is_empty() {
            let t = Instant::now();
            let results = write_pages(node, &pending, &mut self.bufs, upto);
            if t.elapsed() > SLOW_WRITE {
                if let Some(n) = self.slow.due(Instant::now()) {
                    log::warn!(
                        "writing back {} pages took {:.1} s: the device or the I/O path is slow ({n} more slow batches since the last report)",
                        pending.len(),
                        t.elapsed().as_secs_f64()
                    );
                }
            }
            let all_failed = results.iter().all(|r| r.is_err());
            self.failing_pause = if all_failed {
                (self.failing_pause * 2).clamp(Duration::from_millis(1), MAX_FAILING_PAUSE)
            } else {
                Duration::ZERO
            };
            for ((i, pid), r) in pending.iter().zip(results) {
                if let Err(e) = r {
                    let f = buf.frame(*i);
                    if f.pid() == *pid {
                        f.set_dirty(true);
                    }
                    if let Some(pos) = cands.iter().position(|c| c == i) {
                        done[pos] = true; // stays in memory, dirty
                    }
                    buf.counters.write_errors.fetch_add(1, Ordering::Relaxed);
                    self.errors.error(*pid, &e);
                    *buf.provider_error.lock() =
                        Some(format!("writing back page {pid} failed: {e}"));
                }
            }
        }

        // 5. evict the written ones
        for (k, &i) in cands.iter().enumerate() {
            if !done[k] {
                freed += usize::from(evict(node, i));
            }
        }
        buf.counters
            .evictions
            .fetch_add(freed as u64, Ordering::Relaxed);

        // 6. clock
        self.since_tick += freed;
        if self.since_tick >= (n / 128).max(1) {
            self.since_tick = 0;
            buf.tick_clock();
        }
        if freed > 0 && buf.free.len() >= buf.free_target {
            *buf.provider_error.lock() = None;
        }
        freed
    }
}

/// Evict candidate frame `i` if it is still a clean, unlatched page that may go: try the
/// exclusive latch (never wait), check, unlink it and free the frame. Returns whether it did.
pub(crate) fn evict(node: &Node, i: FrameIdx) -> bool {
    let buf = &node.buffer();
    let Some(h) = buf.try_hold_any(i) else {
        return false;
    };
    // in a cluster the frame must still be a plain home copy: since `prepare_evict` the
    // handler may have made it this node's own copy (a grant to a home worker has
    // possession none until its acknowledgements arrive, so possession cannot tell)
    if !h.frame().is_resident() || h.frame().is_dirty() || !node.may_drop(&h) {
        h.release_unchanged();
        return false;
    }
    node.offer_away(&h);
    h.drop_page();
    true
}

/// Write the copies in `bufs` of the pages `pending` names; `upto` is the highest LSN among
/// them: the log up to it is made durable first (the write-ahead rule: no page reaches the
/// store before the log records of its changes).
fn write_pages(
    node: &Node,
    pending: &[(FrameIdx, Pid)],
    bufs: &mut [AlignedPage],
    upto: u64,
) -> Vec<Result<(), shoal_storage::StoreError>> {
    let buf = &node.buffer();
    if let Some(log) = node.log() {
        if let Err(refused) = log.before_write_back(upto) {
            return pending.iter().map(|_| Err(refused())).collect();
        }
    }
    let mut reqs: Vec<WriteRequest<'_>> = pending
        .iter()
        .zip(bufs.iter_mut())
        .map(|((_, pid), page)| WriteRequest {
            slot: pid.slot(),
            pid: pid.raw(),
            page,
        })
        .collect();
    let r = buf.store().write_batch(&mut reqs);
    let ok = r.iter().filter(|r| r.is_ok()).count() as u64;
    buf.counters.writebacks.fetch_add(ok, Ordering::Relaxed);
    r
}

/// Write every dirty page (shutdown; the provider thread must have stopped). Returns how many
/// pages were written, or the first error (pages that failed stay dirty).
pub(crate) fn flush_all(node: &Node) -> Result<usize, EngineError> {
    let buf = &node.buffer();
    let mut bufs: Vec<AlignedPage> = (0..BATCH).map(|_| AlignedPage::new()).collect();
    let mut written = 0;
    let mut first_err: Option<EngineError> = None;
    let mut errors = ErrorLog::new("flushing");
    let mut failures = 0u64;
    let mut frames = buf.frame_indexes().peekable();
    while frames.peek().is_some() {
        let mut pending: Vec<(FrameIdx, Pid)> = Vec::with_capacity(BATCH);
        let mut upto = 0;
        for i in frames.by_ref() {
            let f = buf.frame(i);
            // pages homed elsewhere are never written here (they go home, see release_remote)
            let mine = |f: &crate::buffer::frame::Frame| {
                f.is_resident() && f.is_dirty() && f.pid().node() == buf.node
            };
            if mine(f) {
                let s = buf.hold_shared(i);
                if mine(f) {
                    let k = pending.len();
                    bufs[k].copy_from_slice(s.bytes());
                    f.set_dirty(false);
                    upto = upto.max(f.lsn());
                    pending.push((i, f.pid()));
                }
            }
            if pending.len() == BATCH {
                break;
            }
        }
        if pending.is_empty() {
            continue;
        }
        for ((idx, pid), r) in pending
            .iter()
            .zip(write_pages(node, &pending, &mut bufs, upto))
        {
            match r {
                Ok(()) => written += 1,
                Err(e) => {
                    buf.frame(*idx).set_dirty(true);
                    buf.counters.write_errors.fetch_add(1, Ordering::Relaxed);
                    errors.error(*pid, &e);
                    failures += 1;
                    first_err.get_or_insert(e.into());
                }
            }
        }
    }
    if failures > 1 {
        log::error!("{failures} dirty pages could not be flushed; the store stays marked unclean");
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(written),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_log_reports_the_first_failure_then_one_line_per_interval_with_a_count() {
        let mut log = ErrorLog::new("writing back");
        let t0 = Instant::now();
        assert_eq!(log.due(t0), Some(0));
        for k in 1..=500u64 {
            assert_eq!(log.due(t0 + Duration::from_millis(k)), None);
        }
        assert_eq!(log.unlogged(), 500);
        assert_eq!(log.due(t0 + ERROR_LOG_INTERVAL), Some(500));
        assert_eq!(log.unlogged(), 0);
        assert_eq!(log.due(t0 + ERROR_LOG_INTERVAL), None);
        assert_eq!(log.due(t0 + ERROR_LOG_INTERVAL * 3), Some(1));
    }
}
