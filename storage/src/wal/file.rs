//! [`LogFile`]: the log's device. It creates a log file (preallocated, every sector stamped
//! empty), continues one after a scan, writes a flush's stream as stamped sectors and makes it
//! durable, and writes the header (with the allocator snapshot beside it).
//!
//! What goes into a flush (which chunks, in which order, when) is the engine's log
//! (`shoal_engine`'s durability room): this module only lays out and writes what it is given.
//! [`SectorBuf`] is the buffer a flush is gathered in: the stream goes straight into the
//! sectors' bytes after their stamps as it is pushed, and the stamps are written last.

use super::disk::{
    self, encode_alloc, Header, Layout, RedoPoint, BLOCK, HEADER_BYTES, MAX_LSN, PAD, SBLOCK,
    SECTOR, SECTOR_DATA, STAMP,
};
use super::scan::{bad, io_err, Found};
use super::WalConfig;
use crate::allocator::Allocator;
use crate::error::{StoreError, StoreResult};
use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The first LSN of a new log (never 0, so a zeroed word never looks like a chunk).
pub const FIRST_LSN: u64 = BLOCK;
/// After recovery the log continues this far beyond the last valid chunk, past any LSN a torn
/// flush of the crashed run can have left in the file.
const RESTART_GAP: u64 = 1 << 26;

/// One node's log file, open for writing.
pub struct LogFile {
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
    /// The in-memory ring's size the log was opened with (bytes).
    ring_bytes: usize,
    /// Where appends begin: the LSN, stream position and flush number after the last one.
    start: RedoPoint,
    /// Sequence number of the last header written (the next goes to the other block).
    header_seq: Mutex<u64>,
}

impl std::fmt::Debug for LogFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogFile").field("path", &self.path).finish()
    }
}

impl LogFile {
    /// Create a new, empty log at `cfg.path` (preallocated) for the store `store_id`, with its
    /// two allocator snapshot files, all synced. `alloc` is the allocator state the log starts
    /// from. The caller syncs the directory (the store creates logs under a temporary name and
    /// renames them into place).
    pub(crate) fn create(
        cfg: &WalConfig,
        store_id: u64,
        alloc: &Allocator,
    ) -> StoreResult<LogFile> {
        check_config(cfg)?;
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
        // anything else (zeros, foreign bytes) is damage (`scan`). This also reserves the
        // room where `fallocate` is not supported.
        stamp_empty(&file, &cfg.path, layout, 0, layout.sectors()).map_err(no_room)?;
        crate::fs::resized(&cfg.path, cfg.file_bytes);
        crate::fs::sync_data(&file, &cfg.path).map_err(|e| io_err(&cfg.path, e))?;
        // the first flush is number 2: the start point names the one before it (flush 0 is
        // the empty stamp)
        let start = RedoPoint {
            lsn: FIRST_LSN,
            fpos: 0,
            flush: 1,
        };
        let log = LogFile::new(cfg, file, layout, start, 0);
        // both snapshot files exist from the start: later checkpoints only rewrite them
        for seq in [1, 2] {
            let p = disk::alloc_path(&cfg.path, seq);
            crate::fs::create(&p)
                .and_then(|f| crate::fs::sync_all(&f, &p))
                .map_err(|e| io_err(&p, e))?;
        }
        log.write_header(start, start, alloc, start.flush + 1)?;
        Ok(log)
    }

    /// Continue a recovered (or cleanly closed) log: appends start a safe distance past
    /// `end` (from `scan`), on a fresh block, with flush numbers past every one on the disk,
    /// and the header names that point as the redo start (with `alloc`).
    pub(crate) fn resume(
        cfg: &WalConfig,
        file: File,
        found: &Found,
        end: RedoPoint,
        alloc: &Allocator,
    ) -> StoreResult<LogFile> {
        check_config(cfg)?;
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
        // holds an earlier write's stamp when the next lap tears there (`scan`). (Before the
        // header: a crash now finds it as empty as before.)
        let gap = (end.fpos / SECTOR_DATA + u64::from(!end.fpos.is_multiple_of(SECTOR_DATA)))
            ..fpos / SECTOR_DATA;
        let layout = Layout {
            data_bytes: h.data_bytes,
            store_id: h.store_id,
        };
        stamp_empty(&file, &cfg.path, layout, gap.start, gap.end)
            .and_then(|()| crate::fs::sync_data(&file, &cfg.path))
            .map_err(|e| io_err(&cfg.path, e))?;
        let lsn = (end.lsn + RESTART_GAP).div_ceil(BLOCK) * BLOCK;
        if lsn > MAX_LSN / 2 {
            return Err(bad(&cfg.path, "log sequence numbers exhausted".into()));
        }
        // `end.flush` is the number the first new flush takes; the point names the one before
        let start = RedoPoint {
            lsn,
            fpos,
            flush: end.flush - 1,
        };
        // the next header takes the next number, so it goes to the other block than the one
        // just read: a torn write of it leaves that one intact
        let log = LogFile::new(cfg, file, layout, start, h.seq);
        log.write_header(start, start, alloc, start.flush + 1)?;
        Ok(log)
    }

    fn new(cfg: &WalConfig, file: File, layout: Layout, start: RedoPoint, seq: u64) -> LogFile {
        let direct = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(&cfg.path)
                .ok()
        };
        // one flush takes at most a ring of chunks, a wrap's padding and a block's
        let max_flush = (2 * cfg.ring_bytes as u64 + SBLOCK).div_ceil(SBLOCK) * SBLOCK;
        LogFile {
            path: cfg.path.clone(),
            file,
            direct,
            layout,
            max_flush,
            ring_bytes: cfg.ring_bytes,
            start,
            header_seq: Mutex::new(seq),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where this run's appends begin: the first LSN, its stream position, and (in `flush`)
    /// the number of the flush before the first one this run writes.
    pub fn start(&self) -> RedoPoint {
        self.start
    }

    /// Stream bytes the data area holds (the circle's size).
    pub fn capacity(&self) -> u64 {
        self.layout.capacity()
    }

    /// Bytes of the data area on the device.
    pub fn data_bytes(&self) -> u64 {
        self.layout.data_bytes
    }

    /// The in-memory ring's size this log was opened with (a power of two, bytes).
    pub fn ring_bytes(&self) -> usize {
        self.ring_bytes
    }

    /// A buffer that holds the largest flush this log writes.
    pub fn flush_buffer(&self) -> SectorBuf {
        SectorBuf::new(self.max_flush)
    }

    /// Write the stream gathered in `out` (whole blocks of it, starting at stream position
    /// `fpos`, a block boundary) as flush number `flush`: stamp its sectors, write them where
    /// the circle puts them, and `fdatasync`. Returns the bytes written and the sync's time.
    /// On an error nothing can be promised about what reached the device.
    pub fn write_flush(
        &self,
        out: &mut SectorBuf,
        fpos: u64,
        flush: u64,
    ) -> StoreResult<(u64, Duration)> {
        assert!(fpos.is_multiple_of(SBLOCK), "a flush starts on a block");
        assert!(
            out.len.is_multiple_of(SBLOCK),
            "a flush ends on a block of the stream"
        );
        let first_sector = fpos / SECTOR_DATA;
        let dst = self.direct.as_ref().unwrap_or(&self.file);
        let data = out.stamped(self.layout, first_sector, flush);
        let mut off = 0usize;
        let mut k = first_sector;
        // wrapping at the end of the data area
        while off < data.len() {
            let at = self.layout.sector_offset(k);
            let room = (self.layout.sectors() - k % self.layout.sectors()) * SECTOR;
            let n = (room as usize).min(data.len() - off);
            crate::fs::write_at(dst, &self.path, &data[off..off + n], at)
                .map_err(|e| io_err(&self.path, e))?;
            off += n;
            k += n as u64 / SECTOR;
        }
        let t = Instant::now();
        crate::fs::sync_data(&self.file, &self.path).map_err(|e| io_err(&self.path, e))?;
        Ok((data.len() as u64, t.elapsed()))
    }

    /// Write the allocator snapshot `alloc` and then the header naming `redo` as where replay
    /// begins, `keep` as what must stay readable, and `next_flush` as a number past every
    /// flush written so far (both synced).
    pub fn write_header(
        &self,
        redo: RedoPoint,
        keep: RedoPoint,
        alloc: &Allocator,
        next_flush: u64,
    ) -> StoreResult<()> {
        assert!(
            keep.lsn <= redo.lsn,
            "the keep point precedes the redo point"
        );
        assert!(
            keep.fpos <= redo.fpos,
            "the keep point precedes the redo point"
        );
        let mut hs = self.header_seq.lock();
        let seq = *hs + 1;
        let snap = encode_alloc(alloc);
        let ap = disk::alloc_path(&self.path, seq);
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
            next_flush,
            max_flush: self.max_flush,
        };
        crate::fs::write_at(&self.file, &self.path, &h.encode(), (seq % 2) * BLOCK)
            .and_then(|_| crate::fs::sync_data(&self.file, &self.path))
            .map_err(|e| io_err(&self.path, e))?;
        *hs = seq;
        Ok(())
    }
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

/// One 4 KiB block, aligned as O_DIRECT needs.
#[repr(C, align(4096))]
struct Block([u8; BLOCK as usize]);

/// A fixed-capacity buffer of aligned blocks holding stamped sectors: what one flush writes.
/// The stream goes into the sectors' bytes after their stamps as it is pushed (one copy out of
/// the ring); the stamps are written last ([`LogFile::write_flush`]).
pub struct SectorBuf {
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

    /// Empty it for the next flush.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Stream bytes pushed since the last [`SectorBuf::clear`].
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Stream bytes that still fit.
    pub fn room(&self) -> u64 {
        (self.blocks.len() as u64 * BLOCK / SECTOR) * SECTOR_DATA - self.len
    }

    /// Append stream bytes.
    pub fn push(&mut self, mut bytes: &[u8]) {
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

    /// Append `n` bytes of padding at stream position `*pos` (advanced by `n`): a PAD word at
    /// the first position and at each block start within it ("nothing more in this block"),
    /// zeros elsewhere.
    pub fn pad(&mut self, pos: &mut u64, n: u64) {
        assert!(n.is_multiple_of(8), "padding is whole words");
        let end = *pos + n;
        let mut first = true;
        while *pos < end {
            if first || (*pos).is_multiple_of(SBLOCK) {
                self.push_word(PAD);
            } else {
                self.push_word(0);
            }
            first = false;
            *pos += 8;
        }
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
