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
//! checkpoint, written alternately) and a data area. A flush copies the complete chunks that
//! follow the durable ones, padded to a 4 KiB block (a durable block is never written again),
//! writes them with `pwrite` and makes them durable with `fdatasync`. Whoever needs durability
//! flushes (a committing worker, the provider before a write-back, the log thread): the
//! flush lock is the group-commit queue, and the leader flushes everything complete, for the
//! whole queue.
//!
//! A chunk on disk and in the ring:
//!
//! ```text
//! word 0: lsn                  u64   the chunk's own LSN (the ring's "complete" mark)
//! word 1: len u32 | crc u32          payload bytes (before padding to 8) and their CRC-32
//! payload, padded to 8 bytes with zeros: records (see `put_*`)
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

use crate::allocator::Allocator;
use crate::error::{StoreError, StoreResult};
use crate::page::PAGE_DATA_SIZE;
use parking_lot::{Condvar, Mutex};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Log file block: flushes start and end on block boundaries.
pub const BLOCK: u64 = 4096;
/// The two header blocks at the start of the file.
const HEADER_BYTES: u64 = 2 * BLOCK;
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
const HEADER_MAGIC: u64 = 0x4c41_5720_4c41_4f48; // "HOAL WAL"
const ALLOC_MAGIC: u64 = 0x434f_4c41_4c41_4f48; // "HOALALOC"
/// Format 2 adds the keep point (transactions' undo records); format 1 headers are read with
/// keep = redo.
const FORMAT: u32 = 2;
/// How long a flush waits for a checkpoint to free log space before it reports the log full.
const FULL_WAIT: Duration = Duration::from_secs(30);

/// Record kinds (the first byte of each record in a chunk's payload).
pub mod rec {
    /// A whole page: slot u64, pid u64, `PAGE_DATA_SIZE` bytes.
    pub const IMAGE: u8 = 1;
    /// Changed byte ranges of a page: slot u64, pid u64, count u16, then per range off u16,
    /// len u16 and the bytes.
    pub const DIFF: u8 = 2;
    /// A slot was handed out: slot u64.
    pub const ALLOC: u8 = 3;
    /// A slot was given back: slot u64.
    pub const FREE: u8 = 4;
    /// A checkpoint began here (no body).
    pub const CHECKPOINT: u8 = 5;
    /// How to undo one operation of a transaction (opaque to the log: the layer that made it
    /// applies it after a crash): txn u64 (0: the transaction begins with this chunk, its id
    /// is the LSN just past the chunk), len u32, the bytes.
    pub const UNDO: u8 = 6;
    /// A transaction ended (committed, or rolled back by its owner): txn u64.
    pub const END: u8 = 7;
}

/// Append an undo record of transaction `txn` (0: it begins in this chunk).
pub fn put_undo(buf: &mut Vec<u8>, txn: u64, undo: &[u8]) {
    buf.push(rec::UNDO);
    buf.extend_from_slice(&txn.to_le_bytes());
    buf.extend_from_slice(&(undo.len() as u32).to_le_bytes());
    buf.extend_from_slice(undo);
}

/// Append the end record of transaction `txn`.
pub fn put_end(buf: &mut Vec<u8>, txn: u64) {
    buf.push(rec::END);
    buf.extend_from_slice(&txn.to_le_bytes());
}

/// Append a whole-page record to a chunk being built.
pub fn put_image(buf: &mut Vec<u8>, slot: u64, pid: u64, data: &[u8]) {
    assert_eq!(
        data.len(),
        PAGE_DATA_SIZE,
        "a page image is the whole data area"
    );
    buf.push(rec::IMAGE);
    buf.extend_from_slice(&slot.to_le_bytes());
    buf.extend_from_slice(&pid.to_le_bytes());
    buf.extend_from_slice(data);
}

/// Append a changed-ranges record: `ranges` are (offset, length) into `page` (the data area).
pub fn put_diff(
    buf: &mut Vec<u8>,
    slot: u64,
    pid: u64,
    ranges: impl ExactSizeIterator<Item = (u16, u16)>,
    page: &[u8],
) {
    buf.push(rec::DIFF);
    buf.extend_from_slice(&slot.to_le_bytes());
    buf.extend_from_slice(&pid.to_le_bytes());
    buf.extend_from_slice(&(ranges.len() as u16).to_le_bytes());
    for (off, len) in ranges {
        let (o, l) = (off as usize, len as usize);
        assert!(
            o + l <= PAGE_DATA_SIZE,
            "range {o}+{l} beyond the data area"
        );
        buf.extend_from_slice(&off.to_le_bytes());
        buf.extend_from_slice(&len.to_le_bytes());
        buf.extend_from_slice(&page[o..o + l]);
    }
}

/// Bytes an image record takes.
pub const IMAGE_RECORD: usize = 17 + PAGE_DATA_SIZE;

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

/// The redo start recorded by the last finished checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedoPoint {
    pub lsn: u64,
    /// Position in the data area, counted from the start of the log's life (never wraps).
    pub fpos: u64,
}

/// What a recovery replayed.
#[derive(Debug, Default, Clone)]
pub struct Replay {
    pub chunks: u64,
    pub records: u64,
    pub log_bytes: u64,
    pub pages: u64,
    pub seconds: f64,
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
    /// The last checkpoint record copied out: (lsn, fpos).
    last_checkpoint: Option<RedoPoint>,
    wbuf: BlockBuf,
}

/// One 4 KiB block, aligned as O_DIRECT needs.
#[repr(C, align(4096))]
struct Block([u8; BLOCK as usize]);

/// A fixed-capacity byte buffer of aligned blocks: what one flush writes.
struct BlockBuf {
    blocks: Box<[Block]>,
    len: usize,
}

impl BlockBuf {
    fn new(bytes: u64) -> BlockBuf {
        let n = bytes.div_ceil(BLOCK) as usize;
        BlockBuf {
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

    fn bytes(&self) -> &[u8] {
        // SAFETY: as in `all`, shared.
        unsafe { std::slice::from_raw_parts(self.blocks.as_ptr().cast::<u8>(), self.len) }
    }

    fn room(&self) -> usize {
        self.blocks.len() * BLOCK as usize - self.len
    }

    fn push_word(&mut self, w: u64) {
        let at = self.len;
        self.all()[at..at + 8].copy_from_slice(&w.to_le_bytes());
        self.len += 8;
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
    /// Bytes of the data area.
    data_bytes: u64,
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

fn io_err(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn bad(path: &Path, why: String) -> StoreError {
    StoreError::BadLog {
        path: path.to_path_buf(),
        why,
    }
}

/// The on-disk header: which checkpoint recovery starts from.
#[derive(Debug, Clone, Copy)]
struct Header {
    seq: u64,
    data_bytes: u64,
    redo: RedoPoint,
    keep: RedoPoint,
    /// CRC of the allocator snapshot written with this header (file `seq % 2`).
    alloc_crc: u32,
}

impl Header {
    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK as usize];
        b[0..8].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&FORMAT.to_le_bytes());
        b[12..16].copy_from_slice(&self.alloc_crc.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.data_bytes.to_le_bytes());
        b[32..40].copy_from_slice(&self.redo.lsn.to_le_bytes());
        b[40..48].copy_from_slice(&self.redo.fpos.to_le_bytes());
        b[48..56].copy_from_slice(&self.keep.lsn.to_le_bytes());
        b[56..64].copy_from_slice(&self.keep.fpos.to_le_bytes());
        let crc = crc32fast::hash(&b[..64]);
        b[64..68].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Header> {
        let u64at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let u32at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let format = u32at(8);
        let crc_at = match format {
            1 => 48,
            FORMAT => 64,
            _ => return None,
        };
        if u64at(0) != HEADER_MAGIC || crc32fast::hash(&b[..crc_at]) != u32at(crc_at) {
            return None;
        }
        let redo = RedoPoint {
            lsn: u64at(32),
            fpos: u64at(40),
        };
        let keep = if format == 1 {
            redo
        } else {
            RedoPoint {
                lsn: u64at(48),
                fpos: u64at(56),
            }
        };
        if keep.lsn > redo.lsn || keep.fpos > redo.fpos {
            return None;
        }
        Some(Header {
            alloc_crc: u32at(12),
            seq: u64at(16),
            data_bytes: u64at(24),
            redo,
            keep,
        })
    }
}

pub(crate) fn alloc_path(path: &Path, seq: u64) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".alloc{}", seq % 2));
    PathBuf::from(s)
}

fn encode_alloc(a: &Allocator) -> Vec<u8> {
    let mut b = Vec::with_capacity(32 + a.free_slots().len() * 8);
    b.extend_from_slice(&ALLOC_MAGIC.to_le_bytes());
    b.extend_from_slice(&a.next_slot().to_le_bytes());
    b.extend_from_slice(&(a.free_slots().len() as u64).to_le_bytes());
    for s in a.free_slots() {
        b.extend_from_slice(&s.to_le_bytes());
    }
    b
}

fn decode_alloc(b: &[u8], capacity: u64) -> Option<Allocator> {
    if b.len() < 24 || u64::from_le_bytes(b[0..8].try_into().ok()?) != ALLOC_MAGIC {
        return None;
    }
    let next = u64::from_le_bytes(b[8..16].try_into().ok()?);
    let n = u64::from_le_bytes(b[16..24].try_into().ok()?) as usize;
    if b.len() != 24 + n * 8 {
        return None;
    }
    let free = (0..n)
        .map(|i| u64::from_le_bytes(b[24 + i * 8..32 + i * 8].try_into().expect("8 bytes")))
        .collect();
    Some(Allocator::new(next, free, capacity))
}

/// What a log holds, read without opening a store ([`survey`], for `shoal inspect`).
#[derive(Debug, Clone)]
pub struct LogInfo {
    pub file_bytes: u64,
    /// Checkpoints finished over the log's life (the header's sequence number).
    pub checkpoints: u64,
    /// Where recovery would begin (LSN of the last finished checkpoint).
    pub redo_lsn: u64,
    /// LSN just past the last valid chunk.
    pub end_lsn: u64,
    /// What recovery would replay (its `pages` and `seconds` are 0: nothing is applied).
    pub pending: Replay,
}

/// Read the log at `path`: its header and the chunks after its redo point (nothing written).
pub fn survey(path: &Path) -> StoreResult<LogInfo> {
    let (found, file) = Wal::read_existing(path)?;
    let file_bytes = file.metadata().map_err(|e| io_err(path, e))?.len();
    let (end, mut pending) = Wal::scan(path, &file, &found, |_, _, _| Ok(()))?;
    pending.seconds = 0.0;
    Ok(LogInfo {
        file_bytes,
        checkpoints: found.header.seq,
        redo_lsn: found.header.redo.lsn,
        end_lsn: end.lsn,
        pending,
    })
}

/// What [`Wal::open`] found in an existing log.
pub(crate) struct Found {
    header: Header,
}

impl Found {
    /// Where replaying pages begins (records before it, from the keep point, are read for
    /// transactions only).
    pub(crate) fn redo_lsn(&self) -> u64 {
        self.header.redo.lsn
    }
}

impl Wal {
    /// Create a new, empty log at `cfg.path` (preallocated). `alloc` is the allocator state the
    /// log starts from.
    pub(crate) fn create(cfg: &WalConfig, alloc: &Allocator) -> StoreResult<Wal> {
        Self::check_config(cfg)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&cfg.path)
            .map_err(|e| io_err(&cfg.path, e))?;
        // Reserve the whole file now: a full device is an error at open, never at a commit.
        crate::io::fallocate(&file, 0, cfg.file_bytes).map_err(|e| {
            if crate::io::is_full(&e) {
                StoreError::NoRoomForLog {
                    path: cfg.path.clone(),
                    bytes: cfg.file_bytes,
                    source: e,
                }
            } else {
                io_err(&cfg.path, e)
            }
        })?;
        let data_bytes = cfg.file_bytes - HEADER_BYTES;
        let redo = RedoPoint {
            lsn: FIRST_LSN,
            fpos: 0,
        };
        let wal = Wal::new(cfg, file, data_bytes, redo, 0);
        wal.write_header(redo, redo, alloc)?;
        Ok(wal)
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

    fn new(cfg: &WalConfig, file: File, data_bytes: u64, redo: RedoPoint, seq: u64) -> Wal {
        let words = cfg.ring_bytes / 8;
        let direct = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(&cfg.path)
                .ok()
        };
        Wal {
            path: cfg.path.clone(),
            file,
            direct,
            data_bytes,
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
                // one flush takes at most a ring of chunks, a wrap's padding and a block's
                wbuf: BlockBuf::new(2 * cfg.ring_bytes as u64 + BLOCK),
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

    /// Read the header of the log at `path`: the newest valid one of the two, with the
    /// allocator snapshot written with it.
    pub(crate) fn read_existing(path: &Path) -> StoreResult<(Found, File)> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io_err(path, e))?;
        let mut best: Option<Header> = None;
        for k in 0..2u64 {
            let mut b = vec![0u8; BLOCK as usize];
            if file.read_exact_at(&mut b, k * BLOCK).is_err() {
                continue;
            }
            if let Some(h) = Header::decode(&b) {
                if h.seq % 2 == k && best.is_none_or(|x| h.seq > x.seq) {
                    best = Some(h);
                }
            }
        }
        let header = best.ok_or_else(|| bad(path, "no valid header block".into()))?;
        let len = file.metadata().map_err(|e| io_err(path, e))?.len();
        if header.data_bytes + HEADER_BYTES > len {
            return Err(bad(
                path,
                format!(
                    "header says {} data bytes, the file has {len}",
                    header.data_bytes
                ),
            ));
        }
        Ok((Found { header }, file))
    }

    /// The allocator snapshot written with `found`'s header.
    pub(crate) fn read_alloc(path: &Path, found: &Found, capacity: u64) -> StoreResult<Allocator> {
        let p = alloc_path(path, found.header.seq);
        let b = std::fs::read(&p).map_err(|e| io_err(&p, e))?;
        if crc32fast::hash(&b) != found.header.alloc_crc {
            return Err(bad(
                &p,
                "allocator snapshot does not match the log header".into(),
            ));
        }
        decode_alloc(&b, capacity).ok_or_else(|| bad(&p, "malformed allocator snapshot".into()))
    }

    /// Replay the log of `found` from its redo point: `apply(lsn, record kind, body)` for every
    /// record of every complete chunk, in log order. Returns the LSN and data position just past
    /// the last valid chunk, and the totals.
    pub(crate) fn scan(
        path: &Path,
        file: &File,
        found: &Found,
        mut apply: impl FnMut(u64, u8, &[u8]) -> StoreResult<()>,
    ) -> StoreResult<(RedoPoint, Replay)> {
        let t0 = Instant::now();
        let h = &found.header;
        let s = h.data_bytes;
        let mut at = h.keep;
        let mut out = Replay::default();
        // read the data area in 1 MiB windows
        let mut win: Vec<u8> = Vec::new();
        let mut win_start = u64::MAX; // fpos of win[0]
        let read = |fpos: u64,
                    len: u64,
                    win: &mut Vec<u8>,
                    win_start: &mut u64|
         -> StoreResult<Vec<u8>> {
            let mut out = Vec::with_capacity(len as usize);
            let mut p = fpos;
            while (out.len() as u64) < len {
                if *win_start == u64::MAX || p < *win_start || p >= *win_start + win.len() as u64 {
                    let off = p % s;
                    let n = (1u64 << 20).min(s - off);
                    win.resize(n as usize, 0);
                    file.read_exact_at(win, HEADER_BYTES + off)
                        .map_err(|e| io_err(path, e))?;
                    *win_start = p;
                }
                let i = (p - *win_start) as usize;
                let take = ((len as usize) - out.len()).min(win.len() - i);
                out.extend_from_slice(&win[i..i + take]);
                p += take as u64;
            }
            Ok(out)
        };
        let limit = h.keep.fpos + s;
        loop {
            if at.fpos + CHUNK_HEADER > limit {
                break;
            }
            let in_block = at.fpos % BLOCK;
            let w = read(at.fpos, 8, &mut win, &mut win_start)?;
            let w0 = u64::from_le_bytes(w[..8].try_into().expect("8 bytes"));
            if w0 == PAD {
                at.fpos += BLOCK - in_block;
                continue;
            }
            if w0 != at.lsn {
                break;
            }
            let w1b = read(at.fpos + 8, 8, &mut win, &mut win_start)?;
            let w1 = u64::from_le_bytes(w1b[..8].try_into().expect("8 bytes"));
            let (len, crc) = (w1 & 0xffff_ffff, (w1 >> 32) as u32);
            let size = CHUNK_HEADER + pad8(len as usize) as u64;
            if at.fpos % s + size > s || at.fpos + size > limit {
                break;
            }
            let payload = read(at.fpos + CHUNK_HEADER, len, &mut win, &mut win_start)?;
            if crc32fast::hash(&payload) != crc {
                break;
            }
            out.records += for_each_record(&payload, |kind, body| apply(at.lsn, kind, body))
                .map_err(|why| bad(path, format!("chunk at LSN {}: {why}", at.lsn)))?;
            out.chunks += 1;
            out.log_bytes += size;
            at.lsn += size;
            at.fpos += size;
        }
        out.seconds = t0.elapsed().as_secs_f64();
        Ok((at, out))
    }

    /// Continue a recovered (or cleanly closed) log: appends start a safe distance past `end`,
    /// on a fresh block, and the header names that point as the redo start (with `alloc`).
    pub(crate) fn resume(
        cfg: &WalConfig,
        file: File,
        found: &Found,
        end: RedoPoint,
        alloc: &Allocator,
    ) -> StoreResult<Wal> {
        Self::check_config(cfg)?;
        let s = found.header.data_bytes;
        if cfg.file_bytes != s + HEADER_BYTES {
            log::info!(
                "{}: the log keeps its size of {} MiB (configured {} MiB)",
                cfg.path.display(),
                (s + HEADER_BYTES) >> 20,
                cfg.file_bytes >> 20
            );
        }
        let fpos = end.fpos.div_ceil(BLOCK) * BLOCK;
        let lsn = (end.lsn + RESTART_GAP).div_ceil(BLOCK) * BLOCK;
        if lsn > LSN_MASK / 2 {
            return Err(bad(&cfg.path, "log sequence numbers exhausted".into()));
        }
        let redo = RedoPoint { lsn, fpos };
        let wal = Wal::new(cfg, file, s, redo, found.header.seq + 1);
        // the old chunks from the new start on must not look like the continuation: the first
        // block is overwritten by a PAD now
        wal.write_pad_block(fpos)?;
        wal.write_header(redo, redo, alloc)?;
        Ok(wal)
    }

    fn write_pad_block(&self, fpos: u64) -> StoreResult<()> {
        let mut b = vec![0u8; BLOCK as usize];
        b[..8].copy_from_slice(&PAD.to_le_bytes());
        self.file
            .write_all_at(&b, HEADER_BYTES + fpos % self.data_bytes)
            .map_err(|e| io_err(&self.path, e))
    }

    /// Write the allocator snapshot and then the header naming `redo` (both synced).
    fn write_header(&self, redo: RedoPoint, keep: RedoPoint, alloc: &Allocator) -> StoreResult<()> {
        let mut hs = self.header.lock();
        let seq = hs.seq + 1;
        let snap = encode_alloc(alloc);
        let ap = alloc_path(&self.path, seq);
        let write_snap = || -> std::io::Result<()> {
            let f = File::create(&ap)?;
            f.write_all_at(&snap, 0)?;
            f.sync_all()
        };
        write_snap().map_err(|e| io_err(&ap, e))?;
        let h = Header {
            seq,
            data_bytes: self.data_bytes,
            redo,
            keep,
            alloc_crc: crc32fast::hash(&snap),
        };
        self.file
            .write_all_at(&h.encode(), (seq % 2) * BLOCK)
            .and_then(|_| self.file.sync_data())
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
        self.data_bytes - (2 * self.ring_bytes).min(self.data_bytes / 2)
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
                    bytes: self.data_bytes,
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
        self.data_bytes
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
            if size > self.ring_bytes / 4 || size > self.data_bytes / 4 {
                // (what one exclusive guard logs: its pages' changes and its undo records)
                return Err(StoreError::BadLog {
                    path: self.path.clone(),
                    why: format!(
                        "a log chunk of {size} bytes is larger than a quarter of the ring ({} \
                         bytes) or of the log ({} bytes): log less under one guard, or give \
                         the log more room",
                        self.ring_bytes, self.data_bytes
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

    /// Copy the complete chunks after `f.next` out of the ring and write them durably.
    /// Returns whether anything was written.
    fn flush_locked(&self, f: &mut parking_lot::MutexGuard<'_, Flusher>) -> StoreResult<bool> {
        let s = self.data_bytes;
        let start_lsn = f.next;
        let start_fpos = f.fpos;
        debug_assert_eq!(start_fpos % BLOCK, 0);
        f.wbuf.len = 0;
        let mut pos = f.fpos; // fpos of the next byte of wbuf
        let mut lsn = f.next;
        loop {
            // Acquire pairs with the writer's Release of the mark: the chunk's words are visible.
            if self.word(lsn).load(Ordering::Acquire) != lsn {
                break;
            }
            let w1 = self.word(lsn + 8).load(Ordering::Relaxed);
            let len = (w1 & 0xffff_ffff) as usize;
            let size = CHUNK_HEADER + pad8(len) as u64;
            if pos % s + size > s {
                // no room before the end of the data area: pad to it and go on from its start
                let n = s - pos % s;
                Self::pad_to(&mut f.wbuf, &mut pos, n);
            }
            if pos + size > f.keep.fpos + s {
                break; // the log is full up to the redo point
            }
            if size as usize + 2 * BLOCK as usize > f.wbuf.room() {
                break; // the rest in the next flush
            }
            self.copy_out(lsn, size, &mut f.wbuf);
            if len > 0
                && (self.word(lsn + CHUNK_HEADER).load(Ordering::Relaxed) & 0xff) as u8
                    == rec::CHECKPOINT
            {
                f.last_checkpoint = Some(RedoPoint { lsn, fpos: pos });
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
                        bytes: s,
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
        let rem = (BLOCK - pos % BLOCK) % BLOCK;
        if rem > 0 {
            Self::pad_to(&mut f.wbuf, &mut pos, rem);
        }
        // write, wrapping at the end of the data area
        let mut off = 0usize;
        let mut p = start_fpos;
        let out = self.direct.as_ref().unwrap_or(&self.file);
        let wbuf = f.wbuf.bytes();
        while off < wbuf.len() {
            let at = p % s;
            let n = ((s - at) as usize).min(wbuf.len() - off);
            if let Err(e) = out.write_all_at(&wbuf[off..off + n], HEADER_BYTES + at) {
                self.failed.store(true, Ordering::Release);
                return Err(io_err(&self.path, e));
            }
            off += n;
            p += n as u64;
        }
        let t = Instant::now();
        if let Err(e) = self.file.sync_data() {
            self.failed.store(true, Ordering::Release);
            return Err(io_err(&self.path, e));
        }
        let st = &self.stats;
        let took = t.elapsed().as_nanos() as u64;
        st.sync_nanos.fetch_add(took, Ordering::Relaxed);
        st.sync_max_nanos.fetch_max(took, Ordering::Relaxed);
        st.flushes.fetch_add(1, Ordering::Relaxed);
        st.bytes_written
            .fetch_add(f.wbuf.len as u64, Ordering::Relaxed);
        f.next = lsn;
        f.fpos = pos;
        self.set_used(f.fpos - f.keep.fpos);
        debug_assert!(
            f.fpos - f.keep.fpos <= s,
            "the log overwrote its redo point"
        );
        // Release: whoever reads the new durable point may act on it (write pages back, ack).
        self.durable.store(lsn, Ordering::Release);
        Ok(true)
    }

    /// Copy the complete chunk of `size` bytes at `lsn` out of the ring into `out`.
    fn copy_out(&self, lsn: u64, size: u64, out: &mut BlockBuf) {
        let start = ((lsn % self.ring_bytes) / 8) as usize;
        let words = (size / 8) as usize;
        let first = words.min(self.ring.len() - start);
        for part in [
            &self.ring[start..start + first],
            &self.ring[..words - first],
        ] {
            let at = out.len;
            let n = part.len() * 8;
            // SAFETY: the chunk is complete (its mark was read with Acquire, after its writer's
            // Release), and no thread writes these words until `released` passes them, which
            // only this flush (holding the flusher lock) does afterwards: plain reads of the
            // `AtomicU64`s (same layout as u64) race with no write. Other threads may only
            // read them (mark checks), and reads do not race with reads.
            let src = unsafe { std::slice::from_raw_parts(part.as_ptr().cast::<u8>(), n) };
            out.all()[at..at + n].copy_from_slice(src);
            out.len += n;
        }
    }

    /// Append `n` bytes of padding (a PAD word at each chunk position that starts a block or
    /// the padding).
    fn pad_to(buf: &mut BlockBuf, pos: &mut u64, n: u64) {
        let end = *pos + n;
        let mut first = true;
        while *pos < end {
            if first || (*pos).is_multiple_of(BLOCK) {
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
            self.data_bytes >> 20
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

/// Call `f(kind, body)` for each record of a chunk payload; returns how many there were.
pub(crate) fn for_each_record(
    mut p: &[u8],
    mut f: impl FnMut(u8, &[u8]) -> StoreResult<()>,
) -> Result<u64, String> {
    let mut n = 0;
    while let Some((&kind, rest)) = p.split_first() {
        let len = match kind {
            rec::IMAGE => 16 + PAGE_DATA_SIZE,
            rec::DIFF => {
                if rest.len() < 18 {
                    return Err("short diff record".into());
                }
                let count = u16::from_le_bytes([rest[16], rest[17]]) as usize;
                let mut l = 18;
                for _ in 0..count {
                    if rest.len() < l + 4 {
                        return Err("short diff range".into());
                    }
                    let off = u16::from_le_bytes([rest[l], rest[l + 1]]) as usize;
                    let len = u16::from_le_bytes([rest[l + 2], rest[l + 3]]) as usize;
                    if off + len > PAGE_DATA_SIZE {
                        return Err(format!("diff range {off}+{len} beyond the page"));
                    }
                    l += 4 + len;
                }
                l
            }
            rec::ALLOC | rec::FREE | rec::END => 8,
            rec::CHECKPOINT => 0,
            rec::UNDO => {
                if rest.len() < 12 {
                    return Err("short undo record".into());
                }
                12 + u32::from_le_bytes(rest[8..12].try_into().expect("4 bytes")) as usize
            }
            k => return Err(format!("unknown record kind {k}")),
        };
        if rest.len() < len {
            return Err(format!("record of kind {kind} cut short"));
        }
        f(kind, &rest[..len]).map_err(|e| e.to_string())?;
        n += 1;
        p = &rest[len..];
    }
    Ok(n)
}

/// Apply a diff record's body (after the kind byte) to a page's data area.
pub(crate) fn apply_diff(body: &[u8], page: &mut [u8]) {
    let count = u16::from_le_bytes([body[16], body[17]]) as usize;
    let mut l = 18;
    for _ in 0..count {
        let off = u16::from_le_bytes([body[l], body[l + 1]]) as usize;
        let len = u16::from_le_bytes([body[l + 2], body[l + 3]]) as usize;
        page[off..off + len].copy_from_slice(&body[l + 4..l + 4 + len]);
        l += 4 + len;
    }
}

/// The slot and pid at the start of an image or diff body.
pub(crate) fn slot_pid(body: &[u8]) -> (u64, u64) {
    (
        u64::from_le_bytes(body[0..8].try_into().expect("8 bytes")),
        u64::from_le_bytes(body[8..16].try_into().expect("8 bytes")),
    )
}
