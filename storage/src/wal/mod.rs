//! The write-ahead log of one node's store (docs/durability.md).
//!
//! **In memory** the log is a ring of [`AtomicU64`] words addressed by *log sequence number*
//! (LSN: a byte position in the endless log stream, always a multiple of 8). A writer encodes a
//! *chunk* (one or more records that recovery replays all or nothing) in its own buffer, reserves
//! room with one compare-and-swap on [`Wal::tail`] (no lock), copies the chunk in and marks it
//! complete by storing its header word last. Reservation order is log order: a worker reserves
//! while it still holds the latches of the pages its chunk changes, so the chunks of one page
//! are in the order of its changes, and every prefix of the log is a state the pages went
//! through together.
//!
//! **On disk** the log is a preallocated file used as a circle: two header blocks (the last
//! checkpoint, written alternately) and a data area of stamped 512-byte sectors ([`disk`]). A
//! flush copies the complete chunks that follow the durable ones into a *stream* padded to a
//! whole block (a durable block is never written again), lays it out as sectors stamped with
//! the flush's number, writes them with `pwrite` and makes them durable with `fdatasync`.
//! Whoever needs durability flushes (a committing worker, the provider before a write-back,
//! the log thread): the flush lock is the group-commit queue, and the leader flushes everything
//! complete, for the whole queue. Flushes never overlap: each is synced before the next is
//! written, which is what lets recovery tell a torn tail from damage ([`scan`]).
//!
//! A chunk on disk and in the ring:
//!
//! ```text
//! word 0: lsn                  u64   the chunk's own LSN (the ring's "complete" mark)
//! word 1: len u32 | crc u32          payload bytes (before padding to 8) and their CRC-32
//! payload, padded to 8 bytes with zeros: records (see [`record`])
//! ```
//!
//! A word `PAD` at a chunk boundary means "nothing more in this block".
//!
//! **Checkpoints.** [`Wal::begin_checkpoint`] appends a checkpoint record at LSN `C` and, in the
//! same compare-and-swap, starts a new *epoch*: a page changed for the first time since `C` is
//! logged as a whole image (see [`Wal::append`]), so the log from `C` on holds a full image of
//! every page changed after `C`: recovery never needs a page on disk that a crash may have torn.
//! When every page dirty at `C` is written back and synced, [`Wal::finish_checkpoint`] writes the
//! allocator snapshot and a header naming `C` as the redo start; log space before it is reused.
//!
//! This module must not know about frames or latches: the engine tells it what to append.

pub mod disk;
pub mod record;
mod scan;

pub use disk::{RedoPoint, BLOCK};
pub use record::{put_diff, put_end, put_image, put_undo, rec, IMAGE_RECORD};
pub use scan::{LogEnd, Replay};

use crate::allocator::Allocator;
use crate::error::{StoreError, StoreResult};
use disk::{
    alloc_path, encode_alloc, Header, Layout, HEADER_BYTES, SBLOCK, SECTOR, SECTOR_DATA, STAMP,
};
use parking_lot::{Condvar, Mutex};
pub use scan::ScanMode;
use scan::{bad, io_err};
pub(crate) use scan::{read_alloc, read_existing, scan, Found};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// "Nothing more in this block."
const PAD: u64 = u64::MAX;
const CHUNK_HEADER: u64 = 16;
/// LSNs occupy the low 48 bits of the tail word, the checkpoint epoch the high 16.
const LSN_BITS: u32 = 48;
const LSN_MASK: u64 = (1 << LSN_BITS) - 1;
/// The first LSN of a new log (never 0, so a zeroed word never looks like a chunk).
const FIRST_LSN: u64 = BLOCK;
/// After recovery the log continues this far beyond the last valid chunk, past any LSN a torn
/// flush of the crashed run can have left in the file.
const RESTART_GAP: u64 = 1 << 26;
/// How long a flush waits for a checkpoint to free log space before it reports the log full.
const FULL_WAIT: Duration = Duration::from_secs(30);

/// Configuration of a node's log.
#[derive(Debug, Clone)]
pub struct WalConfig {
    /// The log file (created and preallocated if missing).
    pub path: PathBuf,
    /// Size of the log file (header blocks included); a multiple of 4 KiB, at least 1 MiB.
    pub file_bytes: u64,
    /// Size of the in-memory ring; a power of two, at least 256 KiB.
    pub ring_bytes: usize,
}

impl WalConfig {
    pub fn new(path: PathBuf) -> WalConfig {
        WalConfig {
            path,
            file_bytes: 256 << 20,
            ring_bytes: 16 << 20,
        }
    }
}

/// Counters of one log (all since open).
#[derive(Debug, Default)]
pub struct WalStats {
    pub chunks: AtomicU64,
    /// Whole page images logged (the first change of a page after a checkpoint began).
    pub images: AtomicU64,
    /// Commits that asked for durability (blocking or not).
    pub commits: AtomicU64,
    pub flushes: AtomicU64,
    pub bytes_written: AtomicU64,
    pub sync_nanos: AtomicU64,
    pub sync_max_nanos: AtomicU64,
    pub checkpoints: AtomicU64,
    /// Flushes that waited for a checkpoint to free log space.
    pub full_waits: AtomicU64,
}

/// A copy of [`WalStats`] at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LogCounters {
    pub chunks: u64,
    pub images: u64,
    pub commits: u64,
    pub flushes: u64,
    pub bytes_written: u64,
    pub sync_nanos: u64,
    /// The longest single fdatasync since open (not a difference in [`LogCounters::since`]).
    pub sync_max_nanos: u64,
    pub checkpoints: u64,
    pub full_waits: u64,
}

impl WalStats {
    pub fn snapshot(&self) -> LogCounters {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LogCounters {
            chunks: l(&self.chunks),
            images: l(&self.images),
            commits: l(&self.commits),
            flushes: l(&self.flushes),
            bytes_written: l(&self.bytes_written),
            sync_nanos: l(&self.sync_nanos),
            sync_max_nanos: l(&self.sync_max_nanos),
            checkpoints: l(&self.checkpoints),
            full_waits: l(&self.full_waits),
        }
    }
}

impl LogCounters {
    /// What happened between `earlier` and `self` (the maximum stays the later one's).
    pub fn since(&self, earlier: &LogCounters) -> LogCounters {
        LogCounters {
            chunks: self.chunks - earlier.chunks,
            images: self.images - earlier.images,
            commits: self.commits - earlier.commits,
            flushes: self.flushes - earlier.flushes,
            bytes_written: self.bytes_written - earlier.bytes_written,
            sync_nanos: self.sync_nanos - earlier.sync_nanos,
            sync_max_nanos: self.sync_max_nanos,
            checkpoints: self.checkpoints - earlier.checkpoints,
            full_waits: self.full_waits - earlier.full_waits,
        }
    }

    /// One readable line: log MB/s, commits per flush, fdatasync mean and max.
    pub fn summary(&self, secs: f64) -> String {
        let per_flush = |n: u64| n as f64 / self.flushes.max(1) as f64;
        format!(
            "{:.1} MB/s, {:.0} flushes/s, {:.1} commits/flush, fdatasync mean {:.0} us max {:.0} us, {:.0} whole images/s, {} checkpoints, {} waits for space",
            self.bytes_written as f64 / 1e6 / secs,
            self.flushes as f64 / secs,
            per_flush(self.commits),
            per_flush(self.sync_nanos) / 1e3,
            self.sync_max_nanos as f64 / 1e3,
            self.images as f64 / secs,
            self.checkpoints,
            self.full_waits
        )
    }
}

struct Flusher {
    /// LSN of the next chunk to copy out of the ring.
    next: u64,
    /// Data-area position (since the log's start, never wrapping) of the next block to write.
    fpos: u64,
    /// The redo point: where replaying pages begins.
    redo: RedoPoint,
    /// The keep point (<= redo): the data area before it may be overwritten. Before `redo`
    /// only when a transaction that was running at the last checkpoint began before it (its
    /// undo records must stay readable).
    keep: RedoPoint,
    /// The last checkpoint record copied out: (lsn, fpos, flush).
    last_checkpoint: Option<RedoPoint>,
    /// The number the next flush takes (one more per flush, over the log's life).
    flush: u64,
    /// The flush being written: its stream (chunks and padding) laid out in stamped sectors.
    out: SectorBuf,
}

/// One 4 KiB block, aligned as O_DIRECT needs.
#[repr(C, align(4096))]
struct Block([u8; BLOCK as usize]);

/// A fixed-capacity buffer of aligned blocks holding stamped sectors: what one flush writes.
/// The stream goes into the sectors' bytes after their stamps as it is pushed (one copy out of
/// the ring); the stamps are written last ([`SectorBuf::stamped`]).
struct SectorBuf {
    blocks: Box<[Block]>,
    /// Stream bytes pushed.
    len: u64,
}

impl SectorBuf {
    /// Room for `stream_bytes` of stream.
    fn new(stream_bytes: u64) -> SectorBuf {
        let n = (stream_bytes.div_ceil(SECTOR_DATA) * SECTOR).div_ceil(BLOCK) as usize;
        SectorBuf {
            blocks: (0..n).map(|_| Block([0; BLOCK as usize])).collect(),
            len: 0,
        }
    }

    fn all(&mut self) -> &mut [u8] {
        let n = self.blocks.len() * BLOCK as usize;
        // SAFETY: `Block` is `repr(C)` around a byte array whose size equals its alignment, so
        // the boxed slice is `n` contiguous, initialised bytes, borrowed mutably with `self`.
        unsafe { std::slice::from_raw_parts_mut(self.blocks.as_mut_ptr().cast::<u8>(), n) }
    }

    /// Stream bytes that still fit.
    fn room(&self) -> u64 {
        (self.blocks.len() as u64 * BLOCK / SECTOR) * SECTOR_DATA - self.len
    }

    fn push(&mut self, mut bytes: &[u8]) {
        assert!(
            bytes.len() as u64 <= self.room(),
            "a flush's buffer overflows"
        );
        while !bytes.is_empty() {
            let (k, within) = (self.len / SECTOR_DATA, self.len % SECTOR_DATA);
            let n = ((SECTOR_DATA - within) as usize).min(bytes.len());
            let at = (k * SECTOR + STAMP + within) as usize;
            self.all()[at..at + n].copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            self.len += n as u64;
        }
    }

    fn push_word(&mut self, w: u64) {
        self.push(&w.to_le_bytes());
    }

    /// Stamp every sector (the stream fills whole sectors) as flush `flush` wrote them,
    /// starting at stream sector `k0`; the bytes to write.
    fn stamped(&mut self, layout: Layout, k0: u64, flush: u64) -> &[u8] {
        assert!(
            self.len.is_multiple_of(SECTOR_DATA),
            "a flush ends on a sector"
        );
        let sectors = self.len / SECTOR_DATA;
        let all = self.all();
        for i in 0..sectors {
            let at = (i * SECTOR) as usize;
            all[at..at + STAMP as usize]
                .copy_from_slice(&layout.stamp(k0 + i, flush).to_le_bytes());
        }
        &all[..(sectors * SECTOR) as usize]
    }
}

struct HeaderState {
    seq: u64,
}

/// One node's write-ahead log.
pub struct Wal {
    path: PathBuf,
    file: File,
    /// The same file opened with O_DIRECT for the data area's writes (no copy into the page
    /// cache; `None` where the file system refuses O_DIRECT: then `file` writes).
    direct: Option<File>,
    /// The data area's size and the store's id (sector stamps).
    layout: Layout,
    /// Most stream bytes one flush writes (recorded in the header: recovery looks that far
    /// past a missing chunk for a later flush).
    max_flush: u64,
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
    header: Mutex<HeaderState>,
    /// A write or sync failed: nothing after the durable point can be promised any more.
    failed: AtomicBool,
    /// The log writer ([`Wal::run_writer`]) is about to sleep: a writer placing a chunk wakes it.
    writer_idle: AtomicBool,
    writer_stop: AtomicBool,
    /// Lock and condition of the writer's sleep (the lock guards nothing else).
    writer_sleep: Mutex<()>,
    writer_wake: Condvar,
    /// The log is used beyond [`Wal::admit_limit`]: new changes wait for a checkpoint.
    tight: AtomicBool,
    /// Bytes in use ([`Wal::used_bytes`]), set with `tight`.
    used: AtomicU64,
    pub stats: WalStats,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("path", &self.path)
            .field("durable", &self.durable())
            .finish()
    }
}

fn join(epoch: u64, lsn: u64) -> u64 {
    debug_assert!(lsn <= LSN_MASK);
    (epoch << LSN_BITS) | lsn
}

fn split(t: u64) -> (u64, u64) {
    (t >> LSN_BITS, t & LSN_MASK)
}

fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// What a log holds, read without opening a store ([`survey`], for `shoal inspect`).
#[derive(Debug, Clone)]
pub struct LogInfo {
    pub file_bytes: u64,
    /// Checkpoints finished over the log's life (the header's sequence number).
    pub checkpoints: u64,
    /// Where recovery would begin (LSN of the last finished checkpoint).
    pub redo_lsn: u64,
    /// The id of the store the log belongs to.
    pub store_id: u64,
    /// LSN just past the last valid chunk (where the scan stopped, if the log is damaged).
    pub end_lsn: u64,
    /// How the log ends (None: it is damaged, see `damage`).
    pub end: Option<LogEnd>,
    /// What recovery would replay (its `pages` and `seconds` are 0: nothing is applied).
    pub pending: Replay,
    /// The log is damaged: recovery refuses it with this error (a [`StoreError::LogDamaged`]).
    pub damage: Option<String>,
    /// Header blocks that were not intact (0 and/or 1).
    pub bad_headers: Vec<u64>,
    /// Stream positions of the keep point and of the scan's end (see [`LogInfo::file_offset`]).
    pub keep_fpos: u64,
    pub end_fpos: u64,
    data_bytes: u64,
}

impl LogInfo {
    /// The byte of the log file that holds stream position `fpos`.
    pub fn file_offset(&self, fpos: u64) -> u64 {
        let k = fpos / disk::SECTOR_DATA;
        Layout {
            data_bytes: self.data_bytes,
            store_id: self.store_id,
        }
        .sector_offset(k)
            + disk::STAMP
            + fpos % disk::SECTOR_DATA
    }
}

/// Read the log at `path`: its header and the chunks after its keep point. Opens the file
/// read-only and writes nothing (`shoal inspect`); a damaged log is reported in
/// [`LogInfo::damage`], not as an error. `mode`: [`ScanMode::Judge`] for a store that needs
/// recovery (it reads the whole log), [`ScanMode::End`] for a clean one.
pub fn survey(path: &Path, mode: ScanMode) -> StoreResult<LogInfo> {
    let (found, file) = read_existing(path, false)?;
    let file_bytes = file.metadata().map_err(|e| io_err(path, e))?.len();
    let mut info = LogInfo {
        file_bytes,
        checkpoints: found.header.seq,
        redo_lsn: found.header.redo.lsn,
        store_id: found.store_id(),
        end_lsn: found.header.keep.lsn,
        end: None,
        pending: Replay::default(),
        damage: None,
        bad_headers: found.bad_copies.clone(),
        keep_fpos: found.header.keep.fpos,
        end_fpos: found.header.keep.fpos,
        data_bytes: found.header.data_bytes,
    };
    let r = scan(path, &file, &found, mode, |_, _, _| Ok(()));
    match r {
        Ok(sc) => {
            info.end_lsn = sc.end.lsn;
            info.end_fpos = sc.end.fpos;
            info.end = Some(sc.how);
            info.pending = sc.replay;
            info.pending.seconds = 0.0;
        }
        Err(e @ StoreError::LogDamaged { .. }) => {
            if let StoreError::LogDamaged { lsn, .. } = &e {
                info.end_lsn = *lsn;
            }
            info.damage = Some(e.to_string());
        }
        Err(e) => return Err(e),
    }
    Ok(info)
}

impl Wal {
    /// Create a new, empty log at `cfg.path` (preallocated) for the store `store_id`, with its
    /// two allocator snapshot files, all synced. `alloc` is the allocator state the log starts
    /// from. The caller syncs the directory (the store creates logs under a temporary name and
    /// renames them into place).
    pub(crate) fn create(cfg: &WalConfig, store_id: u64, alloc: &Allocator) -> StoreResult<Wal> {
        Self::check_config(cfg)?;
        let file = crate::fs::create(&cfg.path).map_err(|e| io_err(&cfg.path, e))?;
        let no_room = |e: std::io::Error| {
            if crate::io::is_full(&e) {
                StoreError::NoRoomForLog {
                    path: cfg.path.clone(),
                    bytes: cfg.file_bytes,
                    source: e,
                }
            } else {
                io_err(&cfg.path, e)
            }
        };
        // Reserve the whole file now: a full device is an error at open, never at a commit.
        // `fallocate` says so at once where the file system has it; the stamps below write
        // every byte anyway (and so reserve the room where it has not).
        if !crate::fs::by_writing_forced() {
            match crate::io::fallocate(&file, 0, cfg.file_bytes) {
                Err(e) if crate::fs::not_supported(&e) => log::info!(
                    "{}: fallocate is not supported here ({e}): the log's room is reserved by \
                     writing it",
                    cfg.path.display()
                ),
                r => r.map_err(no_room)?,
            }
        }
        let layout = Layout {
            data_bytes: cfg.file_bytes - HEADER_BYTES,
            store_id,
        };
        // Every sector gets a stamp of flush 0 ("nothing written yet"): from now on, whatever
        // a torn write leaves in a sector is a valid stamp of an earlier write there, and
        // anything else (zeros, foreign bytes) is damage ([`scan`]). This also reserves the
        // room where `fallocate` is not supported.
        Self::stamp_empty(&file, &cfg.path, layout, 0, layout.sectors()).map_err(no_room)?;
        crate::fs::resized(&cfg.path, cfg.file_bytes);
        crate::fs::sync_data(&file, &cfg.path).map_err(|e| io_err(&cfg.path, e))?;
        // the first flush is number 2: the start point names the one before it (flush 0 is
        // the empty stamp)
        let redo = RedoPoint {
            lsn: FIRST_LSN,
            fpos: 0,
            flush: 1,
        };
        let wal = Wal::new(cfg, file, layout, redo, 0);
        // both snapshot files exist from the start: later checkpoints only rewrite them
        for seq in [1, 2] {
            let p = alloc_path(&cfg.path, seq);
            crate::fs::create(&p)
                .and_then(|f| crate::fs::sync_all(&f, &p))
                .map_err(|e| io_err(&p, e))?;
        }
        wal.write_header(redo, redo, alloc)?;
        Ok(wal)
    }

    /// Write stream sectors `from..to` as empty (zeros) stamped by flush 0 (not synced).
    fn stamp_empty(
        file: &File,
        path: &Path,
        layout: Layout,
        from: u64,
        to: u64,
    ) -> std::io::Result<()> {
        const AT_ONCE: u64 = 2048; // sectors: 1 MiB
        let zeros = vec![0u8; (AT_ONCE * SECTOR_DATA) as usize];
        let mut out = vec![0u8; (AT_ONCE * SECTOR) as usize];
        let mut k = from;
        while k < to {
            // never across the end of the data area
            let n = (to - k)
                .min(AT_ONCE)
                .min(layout.sectors() - k % layout.sectors());
            let (src, dst) = (
                &zeros[..(n * SECTOR_DATA) as usize],
                &mut out[..(n * SECTOR) as usize],
            );
            layout.stamp_into(k, 0, src, dst);
            crate::fs::write_at(file, path, dst, layout.sector_offset(k))?;
            k += n;
        }
        Ok(())
    }

    fn check_config(cfg: &WalConfig) -> StoreResult<()> {
        let bad_cfg = |why: String| StoreError::BadLog {
            path: cfg.path.clone(),
            why,
        };
        if cfg.file_bytes < (1 << 20) || !cfg.file_bytes.is_multiple_of(BLOCK) {
            return Err(bad_cfg(format!(
                "log size {} must be a multiple of 4 KiB and at least 1 MiB",
                cfg.file_bytes
            )));
        }
        if !cfg.ring_bytes.is_power_of_two()
            || cfg.ring_bytes < (256 << 10)
            || cfg.ring_bytes as u64 > RESTART_GAP / 2
        {
            return Err(bad_cfg(format!(
                "log ring size {} must be a power of two of 256 KiB to 32 MiB",
                cfg.ring_bytes
            )));
        }
        Ok(())
    }

    fn new(cfg: &WalConfig, file: File, layout: Layout, redo: RedoPoint, seq: u64) -> Wal {
        let words = cfg.ring_bytes / 8;
        let direct = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(&cfg.path)
                .ok()
        };
        // one flush takes at most a ring of chunks, a wrap's padding and a block's
        let stream_bytes = (2 * cfg.ring_bytes as u64 + SBLOCK).div_ceil(SBLOCK) * SBLOCK;
        Wal {
            path: cfg.path.clone(),
            file,
            direct,
            layout,
            max_flush: stream_bytes,
            ring: (0..words).map(|_| AtomicU64::new(0)).collect(),
            ring_bytes: cfg.ring_bytes as u64,
            tail: AtomicU64::new(join(0, redo.lsn)),
            checkpoint_start: AtomicU64::new(redo.lsn),
            released: AtomicU64::new(redo.lsn),
            durable: AtomicU64::new(redo.lsn),
            flusher: Mutex::new(Flusher {
                next: redo.lsn,
                fpos: redo.fpos,
                redo,
                keep: redo,
                last_checkpoint: None,
                flush: redo.flush + 1,
                out: SectorBuf::new(stream_bytes),
            }),
            space: Condvar::new(),
            header: Mutex::new(HeaderState { seq }),
            failed: AtomicBool::new(false),
            tight: AtomicBool::new(false),
            used: AtomicU64::new(0),
            writer_idle: AtomicBool::new(false),
            writer_stop: AtomicBool::new(false),
            writer_sleep: Mutex::new(()),
            writer_wake: Condvar::new(),
            stats: WalStats::default(),
        }
    }

    /// Continue a recovered (or cleanly closed) log: appends start a safe distance past
    /// `end` (from [`scan`]), on a fresh block, with flush numbers past every one on the disk,
    /// and the header names that point as the redo start (with `alloc`).
    pub(crate) fn resume(
        cfg: &WalConfig,
        file: File,
        found: &Found,
        end: RedoPoint,
        alloc: &Allocator,
    ) -> StoreResult<Wal> {
        Self::check_config(cfg)?;
        let h = &found.header;
        if cfg.file_bytes != h.data_bytes + HEADER_BYTES {
            log::info!(
                "{}: the log keeps its size of {} MiB (configured {} MiB)",
                cfg.path.display(),
                (h.data_bytes + HEADER_BYTES) >> 20,
                cfg.file_bytes >> 20
            );
        }
        let fpos = end.fpos.div_ceil(SBLOCK) * SBLOCK;
        // The rest of the last block is never written by this run: stamp it empty, so that it
        // holds an earlier write's stamp when the next lap tears there ([`scan`]). (Before the
        // header: a crash now finds it as empty as before.)
        let gap = (end.fpos / SECTOR_DATA + u64::from(!end.fpos.is_multiple_of(SECTOR_DATA)))
            ..fpos / SECTOR_DATA;
        let layout = Layout {
            data_bytes: h.data_bytes,
            store_id: h.store_id,
        };
        Self::stamp_empty(&file, &cfg.path, layout, gap.start, gap.end)
            .and_then(|()| crate::fs::sync_data(&file, &cfg.path))
            .map_err(|e| io_err(&cfg.path, e))?;
        let lsn = (end.lsn + RESTART_GAP).div_ceil(BLOCK) * BLOCK;
        if lsn > LSN_MASK / 2 {
            return Err(bad(&cfg.path, "log sequence numbers exhausted".into()));
        }
        // `end.flush` is the number the first new flush takes; the point names the one before
        let redo = RedoPoint {
            lsn,
            fpos,
            flush: end.flush - 1,
        };
        // the next header takes the next number, so it goes to the other block than the one
        // just read: a torn write of it leaves that one intact
        let wal = Wal::new(cfg, file, layout, redo, h.seq);
        wal.write_header(redo, redo, alloc)?;
        Ok(wal)
    }

    /// Write the allocator snapshot and then the header naming `redo` (both synced).
    fn write_header(&self, redo: RedoPoint, keep: RedoPoint, alloc: &Allocator) -> StoreResult<()> {
        let mut hs = self.header.lock();
        let seq = hs.seq + 1;
        let snap = encode_alloc(alloc);
        let ap = alloc_path(&self.path, seq);
        let write_snap = || -> std::io::Result<()> {
            // the file exists (made with the log): no directory entry changes here
            let f = crate::fs::create(&ap)?;
            crate::fs::write_at(&f, &ap, &snap, 0)?;
            crate::fs::sync_all(&f, &ap)
        };
        write_snap().map_err(|e| io_err(&ap, e))?;
        let h = Header {
            format: disk::FORMAT,
            seq,
            data_bytes: self.layout.data_bytes,
            redo,
            keep,
            alloc_crc: crc32fast::hash(&snap),
            store_id: self.layout.store_id,
            next_flush: self.flusher.lock().flush,
            max_flush: self.max_flush,
        };
        crate::fs::write_at(&self.file, &self.path, &h.encode(), (seq % 2) * BLOCK)
            .and_then(|_| crate::fs::sync_data(&self.file, &self.path))
            .map_err(|e| io_err(&self.path, e))?;
        hs.seq = seq;
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
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
        let cap = self.layout.capacity();
        cap - (2 * self.ring_bytes).min(cap / 2)
    }

    /// The log is nearly full: a worker about to begin a change (holding no exclusive latch)
    /// should [`Wal::wait_for_room`] first.
    pub fn tight(&self) -> bool {
        self.tight.load(Ordering::Acquire)
    }

    /// Wait until a checkpoint made room (at most 30 s, then [`StoreError::LogFull`]).
    pub fn wait_for_room(&self) -> StoreResult<()> {
        let deadline = Instant::now() + FULL_WAIT;
        let mut f = self.flusher.lock();
        self.stats.full_waits.fetch_add(1, Ordering::Relaxed);
        while self.tight() {
            if self.failed.load(Ordering::Acquire) {
                return Err(self.failure());
            }
            if self.space.wait_until(&mut f, deadline).timed_out() && self.tight() {
                return Err(StoreError::LogFull {
                    path: self.path.clone(),
                    bytes: self.layout.data_bytes,
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
        self.used.store(used, Ordering::Relaxed);
        self.tight
            .store(used > self.admit_limit(), Ordering::Release);
    }

    /// Bytes of the data area.
    pub fn capacity_bytes(&self) -> u64 {
        self.layout.capacity()
    }

    /// Append one chunk. `encode(c, buf)` writes its records into `buf` (empty on each call),
    /// given `c`, the LSN of the latest checkpoint begun: a page whose last logged change is
    /// before `c` must be logged whole. It is called again if a checkpoint begins before the
    /// chunk is placed. Returns the LSN just past the chunk.
    pub fn append(
        &self,
        buf: &mut Vec<u8>,
        encode: impl FnMut(u64, &mut Vec<u8>),
    ) -> StoreResult<u64> {
        self.place(buf, encode, false).map(|(_, end)| end)
    }

    /// [`Wal::append`], returning the chunk's LSN too: (start, end).
    pub fn append_span(
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
            let size = CHUNK_HEADER + pad8(len) as u64;
            if size > self.ring_bytes / 4 || size > self.layout.capacity() / 4 {
                // (what one exclusive guard logs: its pages' changes and its undo records)
                return Err(StoreError::BadLog {
                    path: self.path.clone(),
                    why: format!(
                        "a log chunk of {size} bytes is larger than a quarter of the ring ({} \
                         bytes) or of the log ({} bytes): log less under one guard, or give \
                         the log more room",
                        self.ring_bytes,
                        self.layout.capacity()
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
            buf.resize(pad8(len), 0);
            let crc = crc32fast::hash(&buf[..len]);
            self.put_word(lsn + 8, (len as u64) | ((crc as u64) << 32));
            self.copy_in(lsn + CHUNK_HEADER, buf);
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
    /// flushed: see [`Wal::tight`].
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

    /// The log writer's loop, on a thread of its own until [`Wal::stop_writer`]: with `every`,
    /// flush whatever is complete once per interval (durability `flush-every-ms`); without,
    /// flush as soon as anything is complete (durability `commit`: one flush after another,
    /// each taking every chunk placed while the previous one ran; workers that committed
    /// without waiting see [`Wal::durable`] pass their point). Sleeps while the ring is empty.
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
                // latency). A thread waiting in `flush_to` flushes itself, not after this.
                std::thread::sleep(GATHER);
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

    /// Make [`Wal::run_writer`] return (after its current flush).
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

    /// An error if a write or sync of the log failed (nothing more can be made durable).
    pub fn check_failed(&self) -> StoreResult<()> {
        if self.failed.load(Ordering::Acquire) {
            return Err(self.failure());
        }
        Ok(())
    }

    fn failure(&self) -> StoreError {
        bad(
            &self.path,
            "an earlier log write failed: nothing after the last durable point can be made durable (see the first error)".into(),
        )
    }

    /// Copy the complete chunks after `f.next` out of the ring and write them durably, as
    /// flush number `f.flush`. Returns whether anything was written.
    fn flush_locked(&self, f: &mut parking_lot::MutexGuard<'_, Flusher>) -> StoreResult<bool> {
        let cap = self.layout.capacity();
        let start_lsn = f.next;
        let start_fpos = f.fpos;
        assert!(
            start_fpos.is_multiple_of(SBLOCK),
            "a flush starts on a block of the stream"
        );
        f.out.len = 0;
        let mut pos = f.fpos; // stream position of the next byte pushed
        let mut lsn = f.next;
        let flush = f.flush;
        loop {
            // Acquire pairs with the writer's Release of the mark: the chunk's words are visible.
            if self.word(lsn).load(Ordering::Acquire) != lsn {
                break;
            }
            let w1 = self.word(lsn + 8).load(Ordering::Relaxed);
            let len = (w1 & 0xffff_ffff) as usize;
            let size = CHUNK_HEADER + pad8(len) as u64;
            let wrap = if pos % cap + size > cap {
                cap - pos % cap // no room before the end of the data area: go on from its start
            } else {
                0
            };
            if wrap + size + SBLOCK > f.out.room() {
                break; // the rest in the next flush (the last block's padding fits)
            }
            if pos + wrap + size > f.keep.fpos + cap {
                break; // the log is full up to the keep point
            }
            if wrap > 0 {
                Self::pad_to(&mut f.out, &mut pos, wrap);
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
        if lsn == start_lsn {
            let full = self.word(lsn).load(Ordering::Acquire) == lsn;
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
                        path: self.path.clone(),
                        bytes: self.layout.data_bytes,
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
            Self::pad_to(&mut f.out, &mut pos, rem);
        }
        let phys = f.out.len / SECTOR_DATA * SECTOR;
        // write, wrapping at the end of the data area
        let first_sector = start_fpos / SECTOR_DATA;
        let out = self.direct.as_ref().unwrap_or(&self.file);
        let data = f.out.stamped(self.layout, first_sector, flush);
        let mut off = 0usize;
        let mut k = first_sector;
        while off < data.len() {
            let at = self.layout.sector_offset(k);
            let room = (self.layout.sectors() - k % self.layout.sectors()) * SECTOR;
            let n = (room as usize).min(data.len() - off);
            if let Err(e) = crate::fs::write_at(out, &self.path, &data[off..off + n], at) {
                self.failed.store(true, Ordering::Release);
                return Err(io_err(&self.path, e));
            }
            off += n;
            k += n as u64 / SECTOR;
        }
        let t = Instant::now();
        if let Err(e) = crate::fs::sync_data(&self.file, &self.path) {
            self.failed.store(true, Ordering::Release);
            return Err(io_err(&self.path, e));
        }
        let st = &self.stats;
        let took = t.elapsed().as_nanos() as u64;
        st.sync_nanos.fetch_add(took, Ordering::Relaxed);
        st.sync_max_nanos.fetch_max(took, Ordering::Relaxed);
        st.flushes.fetch_add(1, Ordering::Relaxed);
        st.bytes_written.fetch_add(phys, Ordering::Relaxed);
        f.next = lsn;
        f.fpos = pos;
        f.flush += 1;
        self.set_used(f.fpos - f.keep.fpos);
        assert!(
            f.fpos - f.keep.fpos <= cap,
            "the log overwrote its keep point"
        );
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

    /// Append `n` bytes of padding (a PAD word at each chunk position that starts a block or
    /// the padding).
    fn pad_to(buf: &mut SectorBuf, pos: &mut u64, n: u64) {
        let end = *pos + n;
        let mut first = true;
        while *pos < end {
            if first || (*pos).is_multiple_of(SBLOCK) {
                buf.push_word(PAD);
            } else {
                buf.push_word(0);
            }
            first = false;
            *pos += 8;
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
            self.path.display(),
            self.layout.data_bytes >> 20
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
    /// dirty now, syncs the store and calls [`Wal::finish_checkpoint`] with `C`.
    pub fn begin_checkpoint(&self) -> StoreResult<u64> {
        let mut buf = Vec::with_capacity(8);
        let (c, end) = self.place(&mut buf, |_, b| b.push(rec::CHECKPOINT), true)?;
        self.flush_to(end)?;
        Ok(c)
    }

    /// Finish the checkpoint begun at `c`: every page changed before `c` is durable in the
    /// store. Writes `alloc` (the allocator as it is now; allocations logged before now are in
    /// it, and replaying them again is harmless) and a header naming `c` as the redo start.
    /// `oldest` is the lowest [`Wal::tail`] any transaction running at `c` saw before its
    /// first undo record (read after `c` was placed): the log is kept from the latest earlier
    /// checkpoint at or before it, so that recovery still reads that transaction's undo.
    pub fn finish_checkpoint(
        &self,
        c: u64,
        oldest: Option<u64>,
        alloc: &Allocator,
    ) -> StoreResult<()> {
        let (redo, keep) = {
            let f = self.flusher.lock();
            let redo = match f.last_checkpoint {
                Some(r) if r.lsn == c => r,
                _ => {
                    return Err(bad(
                        &self.path,
                        format!("checkpoint {c} is not the last one written"),
                    ))
                }
            };
            // Every transaction running now began after the previous keep point (it was
            // chosen the same way, or the transaction began after that checkpoint), so one of
            // these three always qualifies.
            let limit = oldest.unwrap_or(u64::MAX).min(c);
            let keep = [redo, f.redo, f.keep]
                .into_iter()
                .find(|p| p.lsn <= limit)
                .unwrap_or(f.keep);
            debug_assert!(
                keep.lsn <= limit,
                "no kept checkpoint precedes a running transaction"
            );
            (redo, keep)
        };
        self.write_header(redo, keep, alloc)?;
        {
            let mut f = self.flusher.lock();
            f.redo = redo;
            f.keep = keep;
            self.set_used(f.fpos - f.keep.fpos);
        }
        self.space.notify_all();
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
