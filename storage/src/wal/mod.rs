//! The write-ahead log's on-disk side (docs/durability.md): what the engine's log writes and
//! what recovery reads back.
//!
//! **On disk** the log is a preallocated file used as a circle: two header blocks (the last
//! checkpoint, written alternately) and a data area of stamped 512-byte sectors ([`disk`]). The
//! engine's log (its durability room) gathers the complete *chunks* (one or more records that
//! recovery replays all or nothing) of its in-memory ring into a *stream* padded to a whole
//! block (a durable block is never written again); [`LogFile::write_flush`] lays it out as
//! sectors stamped with the flush's number, writes them with `pwrite` and makes them durable
//! with `fdatasync`. Flushes never overlap: each is synced before the next is written, which is
//! what lets recovery tell a torn tail from damage ([`scan`]).
//!
//! A chunk on disk:
//!
//! ```text
//! word 0: lsn                  u64   the chunk's own LSN (log sequence number: its byte
//!                                    position in the endless log stream, a multiple of 8)
//! word 1: len u32 | crc u32          payload bytes (before padding to 8) and their CRC-32
//! payload, padded to 8 bytes with zeros: records (see [`record`])
//! ```
//!
//! A word [`PAD`] at a chunk boundary means "nothing more in this block".
//!
//! **Checkpoints.** A checkpoint record at LSN `C` starts a new epoch: a page changed for the
//! first time since `C` is logged as a whole image, so the log from `C` on holds a full image
//! of every page changed after `C`: recovery never needs a page on disk that a crash may have
//! torn. When every page dirty at `C` is written back and synced, the engine writes the
//! allocator snapshot and a header naming `C` as the redo start
//! ([`LogFile::write_header`]); log space before it is reused.
//!
//! This module must not know about frames, latches or the in-memory ring: it writes what it
//! is given and reads back what is there.

pub mod carried;
pub mod disk;
mod file;
pub mod merge;
pub mod record;
mod scan;

pub use disk::{chunk_size, chunk_word1, RedoPoint, BLOCK, CHUNK_HEADER, MAX_LSN, PAD, SBLOCK};
pub use file::{LogFile, SectorBuf, FIRST_LSN};
pub use record::{put_diff, put_end, put_image, put_undo, rec, IMAGE_RECORD};
pub use scan::{LogEnd, Replay};

use crate::error::{StoreError, StoreResult};
use scan::io_err;
pub use scan::ScanMode;
pub(crate) use scan::{read_alloc, read_existing, scan, scan_upto};
use std::path::{Path, PathBuf};

/// Configuration of a node's log.
#[derive(Debug, Clone)]
#[non_exhaustive]
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
        disk::Layout {
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
