//! Reading a log back: its header, its allocator snapshot, and the chunks after its keep point,
//! with the line between the log's end and damage drawn (docs/durability.md, "Faults").
//!
//! The scan reads chunk after chunk. Where the next chunk is not there, it asks which flush
//! the place belongs to and whether any later flush is on the disk:
//!
//! - **A sector stamped by the right flush with the wrong content** (a chunk whose checksum
//!   fails, a word that is neither the expected LSN nor padding) was written whole and damaged
//!   afterwards: [`StoreError::LogDamaged`], never the end of the log.
//! - **A sector no flush of this log wrote** (stale, zero, torn) is where the writes stopped,
//!   unless a whole block of a *later* flush lies anywhere after it: flushes are written one at a
//!   time, each synced before the next begins, so a later flush on the disk proves that this
//!   place was durable once and has been damaged since: [`StoreError::LogDamaged`].
//! - Otherwise the log ends there: cleanly (a flush boundary) or inside the last flush, which
//!   a crash cut off before its sync returned (a *torn tail*: nothing in it was acknowledged).
//!
//! What cannot be told apart: whole sectors erased (zeroed, or rewritten with old content)
//! inside the newest flush, with no later flush after them, look exactly like a write that a
//! power loss cut off. That flush may have been acknowledged; its lost part is at most one
//! flush (docs/durability.md says what that costs).

use super::disk::{
    alloc_path, chunk_size, decode_alloc, Header, Layout, RedoPoint, BLOCK, CHUNK_HEADER, FORMAT,
    HEADER_BYTES, PAD, SBLOCK, SECTOR, SECTOR_DATA, STAMP,
};
use super::record::{pages_named, split_records};
use crate::allocator::Allocator;
use crate::error::{StoreError, StoreResult};
use byteorder::{ByteOrder, LittleEndian};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

/// Sectors read at a time (1 MiB).
const WINDOW_SECTORS: u64 = 2048;
/// Most page ids a damage report lists (all are counted).
const MAX_PAGES_LISTED: usize = 16;
/// How far past a damaged place the scan looks for the next intact chunk to name the end of
/// the damaged range (stream bytes).
const RESYNC_LIMIT: u64 = 64 << 20;

/// What a recovery replayed.
#[derive(Debug, Default, Clone)]
pub struct Replay {
    pub chunks: u64,
    pub records: u64,
    pub log_bytes: u64,
    pub pages: u64,
    pub seconds: f64,
    /// How the log ended (recovery only).
    pub end: Option<LogEnd>,
}

/// Where a scan stopped, when it did not stop at damage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEnd {
    /// At a flush boundary: the next place holds nothing this log wrote after it.
    Clean,
    /// Inside the last flush, which a crash cut off before its sync returned (its writes
    /// reached the device in part): its chunks from `lsn` on were never acknowledged and are
    /// not replayed.
    TornTail { lsn: u64, flush: u64 },
    /// The log is full up to its keep point.
    Full,
    /// At damage, given up as asked ([`ScanMode::DiscardDamage`]): nothing from `lsn` on is
    /// replayed; `why` is the damage.
    Discarded { lsn: u64, why: String },
}

/// How far a scan looks where the next chunk is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanMode {
    /// Read the rest of the circle for later flushes: recovery, and `shoal inspect` of a store
    /// that needs it. Reads up to the whole log.
    Judge,
    /// Stop at the first missing chunk: for a cleanly closed store, whose log holds nothing to
    /// replay and whose header names a flush number past every one written.
    End,
    /// As `Judge`, but damage ends the log instead of failing: everything after it is given
    /// up (`shoal recover --discard-damaged-log`).
    DiscardDamage,
}

/// What [`scan`] found.
#[derive(Debug, Clone)]
pub(crate) struct Scanned {
    /// Just past the last valid chunk; `flush` is the number a resumed log's first flush takes
    /// (beyond every flush number on the disk).
    pub end: RedoPoint,
    pub how: LogEnd,
    pub replay: Replay,
}

/// What an existing log's header says (and which copies were bad).
pub(crate) struct Found {
    pub header: Header,
    /// Header copies that were not intact (0 and/or 1).
    pub bad_copies: Vec<u64>,
}

impl Found {
    /// Where replaying pages begins (records before it, from the keep point, are read for
    /// transactions only).
    pub(crate) fn redo_lsn(&self) -> u64 {
        self.header.redo.lsn
    }

    /// The id of the store the log belongs to (0: none recorded).
    pub(crate) fn store_id(&self) -> u64 {
        self.header.store_id
    }

    /// The log was written by an older format that this build does not read.
    pub(crate) fn older_format(&self) -> Option<u32> {
        (self.header.format < FORMAT).then_some(self.header.format)
    }

    fn layout(&self) -> Layout {
        Layout {
            data_bytes: self.header.data_bytes,
            store_id: self.header.store_id,
        }
    }
}

pub(crate) fn io_err(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn bad(path: &Path, why: String) -> StoreError {
    StoreError::BadLog {
        path: path.to_path_buf(),
        why,
    }
}

/// Read the header of the log at `path`: the newest intact one of the two. `write`: open the
/// file for writing too (recovery continues the log); `shoal inspect` opens it read-only.
pub(crate) fn read_existing(path: &Path, write: bool) -> StoreResult<(Found, File)> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .open(path)
        .map_err(|e| io_err(path, e))?;
    let len = file.metadata().map_err(|e| io_err(path, e))?.len();
    if len < HEADER_BYTES {
        return Err(bad(
            path,
            format!(
                "the file is {len} bytes, shorter than the log's two header blocks: it was cut \
                 short or never finished (a store whose creation a crash interrupted is removed \
                 or completed when it is opened; this one has a store beside it)"
            ),
        ));
    }
    let mut best: Option<Header> = None;
    let mut bad_copies = Vec::new();
    for k in 0..2u64 {
        let mut b = vec![0u8; BLOCK as usize];
        let h = file
            .read_exact_at(&mut b, k * BLOCK)
            .ok()
            .and_then(|()| Header::decode(&b))
            .filter(|h| h.seq % 2 == k);
        match h {
            Some(h) if best.is_none_or(|x| h.seq > x.seq) => best = Some(h),
            Some(_) => {}
            // a block never written (all zero) is not damage: a new log writes one at a time
            None if b.iter().any(|&x| x != 0) => bad_copies.push(k),
            None => {}
        }
    }
    let header = best.ok_or_else(|| bad(path, "neither header block is intact".into()))?;
    if header.data_bytes + HEADER_BYTES > len {
        return Err(bad(
            path,
            format!(
                "the header says {} data bytes but the file has {len} bytes: the log was cut short",
                header.data_bytes
            ),
        ));
    }
    if header.format == FORMAT && (header.data_bytes == 0 || header.data_bytes % BLOCK != 0) {
        return Err(bad(
            path,
            format!(
                "the header's data size {} is not whole blocks",
                header.data_bytes
            ),
        ));
    }
    Ok((Found { header, bad_copies }, file))
}

/// The allocator snapshot written with `found`'s header.
pub(crate) fn read_alloc(path: &Path, found: &Found, capacity: u64) -> StoreResult<Allocator> {
    let p = alloc_path(path, found.header.seq);
    let b = std::fs::read(&p).map_err(|e| io_err(&p, e))?;
    if crc32fast::hash(&b) != found.header.alloc_crc {
        return Err(bad(
            &p,
            "the allocator snapshot does not match the log header (damaged, or from another log)"
                .into(),
        ));
    }
    decode_alloc(&b, capacity).ok_or_else(|| bad(&p, "malformed allocator snapshot".into()))
}

/// Sector-level reads of the stream, through a 1 MiB window.
struct Stream<'a> {
    path: &'a Path,
    file: &'a File,
    layout: Layout,
    win: Vec<u8>,
    /// Stream sector number of `win[0]` (u64::MAX: nothing read).
    win_first: u64,
    /// The last sector whose stamp was checked, and what it said (reads of one chunk come
    /// back to the same sector many times).
    checked: (u64, Option<u32>),
}

impl<'a> Stream<'a> {
    fn new(path: &'a Path, file: &'a File, layout: Layout) -> Stream<'a> {
        Stream {
            path,
            file,
            layout,
            win: Vec::new(),
            win_first: u64::MAX,
            checked: (u64::MAX, None),
        }
    }

    /// The physical bytes of stream sector `k`.
    fn sector(&mut self, k: u64) -> StoreResult<&[u8]> {
        let inside = self.win_first != u64::MAX
            && k >= self.win_first
            && k < self.win_first + self.win.len() as u64 / SECTOR;
        if !inside {
            // never across the end of the data area: the window is contiguous on the disk
            let n = WINDOW_SECTORS.min(self.layout.sectors() - k % self.layout.sectors());
            self.win.resize((n * SECTOR) as usize, 0);
            self.file
                .read_exact_at(&mut self.win, self.layout.sector_offset(k))
                .map_err(|e| io_err(self.path, e))?;
            self.win_first = k;
        }
        let i = ((k - self.win_first) * SECTOR) as usize;
        Ok(&self.win[i..i + SECTOR as usize])
    }

    /// The flush whose stamp stream sector `k` carries, if the stamp is valid for it.
    fn flush_of(&mut self, k: u64) -> StoreResult<Option<u32>> {
        if self.checked.0 == k {
            return Ok(self.checked.1);
        }
        let stamp = self.stamp(k)?;
        let f = self.layout.stamped_by(k, stamp);
        self.checked = (k, f);
        Ok(f)
    }

    fn stamp(&mut self, k: u64) -> StoreResult<u64> {
        let s = self.sector(k)?;
        Ok(u64::from_le_bytes(
            s[..STAMP as usize].try_into().expect("8 bytes"),
        ))
    }

    /// Whether the physical sector of stream sector `k` holds what was there before flush
    /// `owner` wrote it (or should have): a valid stamp of an older flush at the same place,
    /// or of any write one lap (or a few) earlier. A new log stamps every sector empty, and a
    /// resumed one the rest of its last block, so a write the crash tore always leaves such a
    /// stamp; zeros, foreign bytes or another place's sector never are.
    fn holds_earlier_write(&mut self, k: u64, owner: u64) -> StoreResult<bool> {
        let stamp = self.stamp(k)?;
        let l = self.layout;
        if let Some(f) = l.stamped_by(k, stamp) {
            return Ok((f.wrapping_sub(owner as u32) as i32) < 0);
        }
        let laps = (k / l.sectors()).min(4);
        Ok((1..=laps).any(|m| l.stamped_by(k - m * l.sectors(), stamp).is_some()))
    }

    /// Stream bytes `[p, p + len)`, and the first of their sectors not stamped by `flush`
    /// (None: all of them were).
    fn read(&mut self, p: u64, len: u64, flush: u64) -> StoreResult<(Vec<u8>, Option<u64>)> {
        let mut out = Vec::with_capacity(len as usize);
        let hole = self.read_into(p, len, flush, &mut out)?;
        Ok((out, hole))
    }

    /// [`Stream::read`] into `out` (cleared first).
    fn read_into(
        &mut self,
        p: u64,
        len: u64,
        flush: u64,
        out: &mut Vec<u8>,
    ) -> StoreResult<Option<u64>> {
        out.clear();
        let mut hole = None;
        let mut at = p;
        while at < p + len {
            let k = at / SECTOR_DATA;
            if hole.is_none() && self.flush_of(k)? != Some(flush as u32) {
                hole = Some(k);
            }
            let within = at % SECTOR_DATA;
            let take = (SECTOR_DATA - within).min(p + len - at);
            let s = self.sector(k)?;
            let from = (STAMP + within) as usize;
            out.extend_from_slice(&s[from..from + take as usize]);
            at += take;
        }
        Ok(hole)
    }

    /// The word at stream position `p` (a multiple of 8: a word never straddles sectors,
    /// whose 504 bytes are 63 words) and whether its sector is not stamped by `flush`.
    fn word(&mut self, p: u64, flush: u64) -> StoreResult<(u64, Option<u64>)> {
        debug_assert!(p.is_multiple_of(8));
        let k = p / SECTOR_DATA;
        let hole = (self.flush_of(k)? != Some(flush as u32)).then_some(k);
        let from = (STAMP + p % SECTOR_DATA) as usize;
        let s = self.sector(k)?;
        Ok((LittleEndian::read_u64(&s[from..]), hole))
    }
}

/// The verdict on a place where the next chunk is not there.
enum Verdict {
    End { how: LogEnd, next_flush: u64 },
    Damaged(Damage),
}

/// Where damage was found and what it covers (for [`StoreError::LogDamaged`]).
#[derive(Debug, Clone)]
struct Damage {
    lsn: u64,
    fpos: u64,
    why: String,
    /// The next intact chunk after the damage (its LSN), if one was found.
    resumes_at: Option<u64>,
}

/// Read the log of `found` from its keep point: `apply(lsn, record kind, body)` for every
/// record of every intact chunk, in log order. Returns where the log ends and the totals, or
/// [`StoreError::LogDamaged`] if a chunk is damaged with durable data after it (nothing is
/// applied past the damage; the caller writes nothing on an error).
pub(crate) fn scan(
    path: &Path,
    file: &File,
    found: &Found,
    mode: ScanMode,
    apply: impl FnMut(u64, u8, &[u8]) -> StoreResult<()>,
) -> StoreResult<Scanned> {
    scan_upto(path, file, found, mode, u64::MAX, apply)
}

/// As [`scan`], but stops at the first chunk at or after LSN `upto` (the log of a running
/// node, durable up to `upto`, whose tail is being written meanwhile; the caller ignores the
/// end returned).
pub(crate) fn scan_upto(
    path: &Path,
    file: &File,
    found: &Found,
    mode: ScanMode,
    upto: u64,
    mut apply: impl FnMut(u64, u8, &[u8]) -> StoreResult<()>,
) -> StoreResult<Scanned> {
    let t0 = Instant::now();
    let h = &found.header;
    if let Some(f) = found.older_format() {
        return Err(bad(
            path,
            format!(
                "written in log format {f}, which this build does not read (it reads format \
                 {FORMAT}); recover the store with the Shoal that wrote it first"
            ),
        ));
    }
    let layout = found.layout();
    let cap = layout.capacity();
    let limit = h.keep.fpos + cap;
    let mut s = Stream::new(path, file, layout);
    let mut at = h.keep;
    let mut out = Replay::default();
    let mut payload = Vec::new();
    let mut records = Vec::new();
    let verdict = loop {
        if at.lsn >= upto {
            break Verdict::End {
                how: LogEnd::Clean,
                next_flush: at.flush + 1,
            };
        }
        if at.fpos + CHUNK_HEADER > limit {
            break Verdict::End {
                how: LogEnd::Full,
                next_flush: at.flush + 1,
            };
        }
        let k = at.fpos / SECTOR_DATA;
        let block_start = at.fpos.is_multiple_of(SBLOCK);
        // the flush that wrote this place: the current one, or the next if a block begins here
        let f = match s.flush_of(k)? {
            Some(q) if q == at.flush as u32 => at.flush,
            Some(q) if block_start && q == (at.flush + 1) as u32 => at.flush + 1,
            _ => {
                let owner = (!block_start).then_some(at.flush);
                break stop(&mut s, mode, h, at, k, at.flush, owner)?;
            }
        };
        let (w0, hole) = s.word(at.fpos, f)?;
        if let Some(hk) = hole {
            break stop(&mut s, mode, h, at, hk, f, Some(f))?;
        }
        if w0 == PAD {
            at.flush = f;
            at.fpos += SBLOCK - at.fpos % SBLOCK;
            continue;
        }
        let damaged = |why: String| Damage {
            lsn: at.lsn,
            fpos: at.fpos,
            why,
            resumes_at: None,
        };
        if w0 != at.lsn {
            break Verdict::Damaged(damaged(format!(
                "the chunk header holds {w0:#x} where LSN {} belongs (the sector was written by \
                 flush {f}: its content was damaged afterwards)",
                at.lsn
            )));
        }
        let (w1, hole) = s.word(at.fpos + 8, f)?;
        if let Some(hk) = hole {
            break stop(&mut s, mode, h, at, hk, f, Some(f))?;
        }
        let (len, crc) = (w1 & 0xffff_ffff, (w1 >> 32) as u32);
        let size = chunk_size(len as usize);
        if at.fpos % cap + size > cap || at.fpos + size > limit {
            break Verdict::Damaged(damaged(format!(
                "the chunk's length {len} runs past the end of the log's data area"
            )));
        }
        let hole = s.read_into(at.fpos + CHUNK_HEADER, len, f, &mut payload)?;
        if let Some(hk) = hole {
            break stop(&mut s, mode, h, at, hk, f, Some(f))?;
        }
        if crc32fast::hash(&payload) != crc {
            break Verdict::Damaged(damaged(format!(
                "checksum mismatch in a chunk of {len} bytes whose every sector flush {f} wrote: \
                 the data was damaged after it was written"
            )));
        }
        // all records are split out before any is applied: a chunk is replayed whole or not
        // at all
        if let Err(why) = split_records(&payload, &mut records) {
            break Verdict::Damaged(damaged(format!("malformed record: {why}")));
        }
        for &(kind, from, to) in &records {
            apply(at.lsn, kind, &payload[from..to])
                .map_err(|e| bad(path, format!("replaying the chunk at LSN {}: {e}", at.lsn)))?;
        }
        out.records += records.len() as u64;
        out.chunks += 1;
        out.log_bytes += size;
        at.lsn += size;
        at.fpos += size;
        at.flush = f;
    };
    out.seconds = t0.elapsed().as_secs_f64();
    match verdict {
        Verdict::End { how, next_flush } => Ok(Scanned {
            end: RedoPoint {
                lsn: at.lsn,
                fpos: at.fpos,
                flush: next_flush.max(h.next_flush),
            },
            how,
            replay: out,
        }),
        Verdict::Damaged(mut d) => {
            if d.resumes_at.is_none() {
                d.resumes_at = resync(&mut s, d.fpos + 8, d.lsn, limit)?;
            }
            let pages = pages_near(&mut s, d.fpos);
            let e = damage_error(path, found, &d, pages, &out);
            if mode != ScanMode::DiscardDamage {
                return Err(e);
            }
            // a resumed log must number its flushes past every one on the disk
            let newest = newest_flush(&mut s, at.fpos, limit, at.flush)?;
            Ok(Scanned {
                end: RedoPoint {
                    lsn: at.lsn,
                    fpos: at.fpos,
                    flush: (newest + 1).max(h.next_flush),
                },
                how: LogEnd::Discarded {
                    lsn: d.lsn,
                    why: e.to_string(),
                },
                replay: out,
            })
        }
    }
}

/// The next chunk is missing: judge the hole ([`judge_hole`]) or, in [`ScanMode::End`], take
/// it as the end.
fn stop(
    s: &mut Stream<'_>,
    mode: ScanMode,
    h: &Header,
    at: RedoPoint,
    hole: u64,
    last: u64,
    owner: Option<u64>,
) -> StoreResult<Verdict> {
    match mode {
        ScanMode::Judge | ScanMode::DiscardDamage => judge_hole(s, h, at, hole, last, owner),
        ScanMode::End => Ok(Verdict::End {
            how: LogEnd::Clean,
            next_flush: (last + 2).max(h.next_flush),
        }),
    }
}

/// The next chunk is missing at `at`: its sector `hole` was not written by the flush expected
/// there. `last` is the flush of the last intact sector before it; `owner` the flush the hole's
/// block belongs to when that is known (the hole lies inside a block or chunk of that flush).
/// Zeros or foreign bytes in the hole are damage. A hole that holds an earlier write's stamp
/// is a torn write, unless a whole block of a later flush than the owner lies after it: the
/// scan looks for one over four flushes' worth of the log past the hole (the most a device
/// that lost or misplaced up to three consecutive flush writes can hide), or to the end of the
/// circle if that is nearer.
fn judge_hole(
    s: &mut Stream<'_>,
    h: &Header,
    at: RedoPoint,
    hole: u64,
    last: u64,
    owner: Option<u64>,
) -> StoreResult<Verdict> {
    /// Flush numbers further ahead than this are stale sectors that passed their check by
    /// chance, not flushes of this log.
    const SANE: i32 = 1 << 24;
    let limit = h.keep.fpos + s.layout.capacity();
    let window = 4 * h.max_flush.max(SBLOCK) + 2 * SBLOCK;
    let end_k = limit.min(hole * SECTOR_DATA + window).div_ceil(SECTOR_DATA);
    let header_next = h.next_flush;
    let per_block = BLOCK / SECTOR;
    // sectors after the hole that carry the flush before it / the one after
    let (mut has_last, mut has_next) = (false, false);
    // whole blocks of flushes after `last`: (first sector, flush), one entry per change
    let mut later: Vec<(u64, u64)> = Vec::new();
    let mut newest = last;
    let mut k = hole + 1;
    while k < end_k {
        let first = k / per_block * per_block;
        let stop = (first + per_block).min(end_k);
        let mut same: Option<Option<u32>> = None;
        for j in k..stop {
            let q = s.flush_of(j)?;
            if let Some(q) = q {
                let d = q.wrapping_sub(last as u32) as i32;
                has_last |= d == 0;
                has_next |= d == 1;
                if d > 0 && d < SANE {
                    newest = newest.max(last + d as u64);
                }
            }
            same = Some(match same {
                None => q,
                Some(p) if p == q => p,
                Some(_) => None,
            });
        }
        // whole blocks only as evidence: a stale sector passes its check by chance once in
        // 2^32; eight in a row with one flush number, never
        if let (true, Some(Some(q))) = (first == k && stop == first + per_block, same) {
            let d = q.wrapping_sub(last as u32) as i32;
            if d > 0 && d < SANE && later.last().is_none_or(|&(_, f)| f != last + d as u64) {
                later.push((first, last + d as u64));
            }
        }
        k = stop;
    }
    let owner = owner.unwrap_or(if has_last { last } else { last + 1 });
    if !s.holds_earlier_write(hole, owner)? {
        let resumes = match later.first() {
            Some(&(k_later, f)) => chunk_in_block(s, k_later * SECTOR_DATA, f, at.lsn)?,
            None => None,
        };
        return Ok(Verdict::Damaged(Damage {
            lsn: at.lsn,
            fpos: at.fpos,
            why: format!(
                "the sector at stream position {} holds neither what flush {owner} wrote there \
                 nor what an earlier write left (a torn write leaves the latter): it was \
                 erased or overwritten (zeros, or bytes of another place or file)",
                hole * SECTOR_DATA
            ),
            resumes_at: resumes,
        }));
    }
    if let Some(&(k_later, f)) = later.iter().find(|&&(_, f)| f > owner) {
        let fpos = k_later * SECTOR_DATA;
        let resumes = chunk_in_block(s, fpos, f, at.lsn)?;
        return Ok(Verdict::Damaged(Damage {
            lsn: at.lsn,
            fpos: at.fpos,
            why: format!(
                "its sectors from stream position {} on were not written by the flush they belong \
                 to (flush {owner}: erased, zeroed or overwritten since), yet flush {f}, which \
                 began only after that one was durable, lies {} KiB further on",
                hole * SECTOR_DATA,
                fpos.saturating_sub(hole * SECTOR_DATA) >> 10
            ),
            resumes_at: resumes,
        }));
    }
    let torn = owner == last || has_next;
    Ok(Verdict::End {
        how: if torn {
            LogEnd::TornTail {
                lsn: at.lsn,
                flush: owner,
            }
        } else {
            LogEnd::Clean
        },
        next_flush: (owner + 1).max(newest + 1).max(header_next),
    })
}

/// The highest flush number stamped (validly) on any sector from stream position `from` to
/// `limit`, at least `floor` (numbers more than 2^24 ahead of `floor` are chance matches).
fn newest_flush(s: &mut Stream<'_>, from: u64, limit: u64, floor: u64) -> StoreResult<u64> {
    let mut newest = floor;
    for k in from / SECTOR_DATA..limit.div_ceil(SECTOR_DATA) {
        if let Some(q) = s.flush_of(k)? {
            let d = q.wrapping_sub(floor as u32) as i32;
            if d > 0 && d < (1 << 24) {
                newest = newest.max(floor + d as u64);
            }
        }
    }
    Ok(newest)
}

/// The LSN of the first intact chunk in the block at stream position `fpos` (written by flush
/// `f`), looking at its 8-byte positions; None if none validates.
fn chunk_in_block(s: &mut Stream<'_>, fpos: u64, f: u64, after: u64) -> StoreResult<Option<u64>> {
    let mut p = fpos;
    while p < fpos + SBLOCK {
        if let Some(lsn) = chunk_at(s, p, f, after)? {
            return Ok(Some(lsn));
        }
        p += 8;
    }
    Ok(None)
}

/// The LSN of an intact chunk of flush `f` at stream position `p` with an LSN above `after`.
fn chunk_at(s: &mut Stream<'_>, p: u64, f: u64, after: u64) -> StoreResult<Option<u64>> {
    let (w0, hole) = s.word(p, f)?;
    if hole.is_some() || w0 <= after || w0 == PAD || w0 % 8 != 0 || w0 > after + (1 << 40) {
        return Ok(None);
    }
    let (w1, hole) = s.word(p + 8, f)?;
    let len = w1 & 0xffff_ffff;
    if hole.is_some() || len > (64 << 20) {
        return Ok(None);
    }
    let (payload, hole) = s.read(p + CHUNK_HEADER, len, f)?;
    Ok((hole.is_none() && crc32fast::hash(&payload) == (w1 >> 32) as u32).then_some(w0))
}

/// Look for the next intact chunk after damage at stream position `from` (any flush).
fn resync(s: &mut Stream<'_>, from: u64, after: u64, limit: u64) -> StoreResult<Option<u64>> {
    let mut p = from.div_ceil(8) * 8;
    let end = limit.min(from + RESYNC_LIMIT);
    while p + CHUNK_HEADER <= end {
        if let Some(f) = s.flush_of(p / SECTOR_DATA)? {
            // the flush number in the stamp, widened: only equality matters below
            if let Some(lsn) = chunk_at(s, p, f as u64, after)? {
                return Ok(Some(lsn));
            }
        }
        p += 8;
    }
    Ok(None)
}

/// Page ids named by the records of the (damaged) chunk at `fpos`, as far as they read.
fn pages_near(s: &mut Stream<'_>, fpos: u64) -> Vec<u64> {
    let Ok(Some(f)) = s.flush_of(fpos / SECTOR_DATA) else {
        return Vec::new();
    };
    let f = f as u64;
    let Ok((w1, _)) = s.word(fpos + 8, f) else {
        return Vec::new();
    };
    let len = (w1 & 0xffff_ffff).min(64 << 20);
    let Ok((payload, _)) = s.read(fpos + CHUNK_HEADER, len, f) else {
        return Vec::new();
    };
    let mut pages = pages_named(&payload);
    pages.sort_unstable();
    pages.dedup();
    pages
}

fn damage_error(
    path: &Path,
    found: &Found,
    d: &Damage,
    pages: Vec<u64>,
    before: &Replay,
) -> StoreError {
    let listed: Vec<String> = pages
        .iter()
        .take(MAX_PAGES_LISTED)
        .map(|p| format!("{p:#x}"))
        .collect();
    let pages_text = if pages.is_empty() {
        "no page it changed can be read".to_string()
    } else {
        format!(
            "it changed page(s) {}{}",
            listed.join(", "),
            if pages.len() > MAX_PAGES_LISTED {
                format!(" and {} more", pages.len() - MAX_PAGES_LISTED)
            } else {
                String::new()
            }
        )
    };
    let range = match d.resumes_at {
        Some(e) => format!("LSN {} to {e}", d.lsn),
        None => format!("LSN {} on", d.lsn),
    };
    let headers = if found.bad_copies.is_empty() {
        String::new()
    } else {
        format!(
            "; header block(s) {:?} were not intact, so an older checkpoint was used",
            found.bad_copies
        )
    };
    StoreError::LogDamaged {
        path: path.to_path_buf(),
        lsn: d.lsn,
        resumes_at: d.resumes_at,
        pages,
        why: format!(
            "{range} (stream position {}) is damaged: {}; {pages_text}; {} chunks before it are \
             intact{headers}",
            d.fpos, d.why, before.chunks
        ),
    }
}
