//! The log file's layout: header blocks, stamped sectors, allocator snapshots.
//!
//! ```text
//! file:    [header block 0][header block 1][data area: data_bytes, a multiple of 4 KiB]
//! sector:  [stamp u64][504 bytes of the stream]          (512 bytes; 8 to a 4 KiB block)
//! stamp:   flush u32 | check u32 << 32
//! check:   the high 32 bits of mix(store id, sector number, flush)
//! ```
//!
//! **The stream** is what the flusher writes: chunks and padding, addressed by a *stream
//! position* (`fpos`, counted from the start of the log's life, never wrapping; the data area
//! holds [`Layout::capacity`] bytes of it, used as a circle). Sector `k` of the stream (bytes
//! `k * 504 ..`) lives in physical sector `k % sectors` of the data area.
//!
//! **Stamps** tell a sector that a flush wrote from one it did not reach. Every sector carries
//! the number of the flush that wrote it and a check over the store's id, the sector's number
//! in the stream and that flush number. After a crash a sector whose stamp is not valid for its
//! place was not written there by this log since that place was last reused: a torn or never
//! reached write, or data erased later. A sector whose stamp is valid but whose chunk fails its
//! checksum was written whole and damaged afterwards: corruption, never the log's end
//! (`scan.rs` draws the line). A bit flip in a stamp alone leaves the chunk's checksum intact,
//! so it is harmless.
//!
//! **Flush numbers** grow by one per flush over the log's life, across restarts (a resumed log
//! continues past every number the old one can have written), so a later flush can be told
//! from an earlier one wherever it lies in the circle.

use crate::allocator::Allocator;
use byteorder::{ByteOrder, LittleEndian};
use std::path::{Path, PathBuf};

/// Log file block: flushes start and end on block boundaries.
pub const BLOCK: u64 = 4096;
/// The two header blocks at the start of the file.
pub(crate) const HEADER_BYTES: u64 = 2 * BLOCK;
/// Physical sector: the unit a power loss tears at, and the unit that carries a stamp.
pub(crate) const SECTOR: u64 = 512;
/// Bytes of a sector before its stream bytes.
pub(crate) const STAMP: u64 = 8;
/// Stream bytes per sector.
pub(crate) const SECTOR_DATA: u64 = SECTOR - STAMP;
/// Stream bytes per 4 KiB block: flushes start and end on multiples of this.
pub const SBLOCK: u64 = SECTOR_DATA * (BLOCK / SECTOR);

/// A chunk's header: its LSN (word 0, the ring's "complete" mark) and `len u32 | crc u32`
/// (word 1); the payload follows, padded to 8 bytes with zeros.
pub const CHUNK_HEADER: u64 = 16;
/// A word `PAD` at a chunk boundary means "nothing more in this block".
pub const PAD: u64 = u64::MAX;
/// LSNs fit in 48 bits (the engine packs a checkpoint epoch above them).
pub const MAX_LSN: u64 = (1 << 48) - 1;

/// Bytes a chunk whose payload is `len` bytes takes in the log (header and padding included).
pub fn chunk_size(len: usize) -> u64 {
    CHUNK_HEADER + len.div_ceil(8) as u64 * 8
}

/// Word 1 of a chunk whose payload (before padding) is `payload`: its length and CRC-32.
pub fn chunk_word1(payload: &[u8]) -> u64 {
    (payload.len() as u64) | ((crc32fast::hash(payload) as u64) << 32)
}

pub(crate) const HEADER_MAGIC: u64 = 0x4c41_5720_4c41_4f48; // "HOAL WAL"
pub(crate) const ALLOC_MAGIC: u64 = 0x434f_4c41_4c41_4f48; // "HOALALOC"
/// Format 3: stamped sectors, the store's id and flush numbers in the header. Formats 1 and 2
/// (no stamps) are recognised only to say that this build does not read them.
pub(crate) const FORMAT: u32 = 3;

/// The mapping between stream positions and the file, for a data area of `data_bytes`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub data_bytes: u64,
    pub store_id: u64,
}

impl Layout {
    /// Sectors in the data area.
    pub fn sectors(&self) -> u64 {
        self.data_bytes / SECTOR
    }

    /// Stream bytes the data area holds.
    pub fn capacity(&self) -> u64 {
        self.sectors() * SECTOR_DATA
    }

    /// File offset of stream sector `k` (its stamp).
    pub fn sector_offset(&self, k: u64) -> u64 {
        HEADER_BYTES + (k % self.sectors()) * SECTOR
    }

    /// The stamp flush `flush` writes into stream sector `k`.
    pub fn stamp(&self, k: u64, flush: u64) -> u64 {
        let f = flush as u32;
        (f as u64) | ((self.check(k, f) as u64) << 32)
    }

    /// The flush that wrote stream sector `k`, if `stamp` is valid for it.
    pub fn stamped_by(&self, k: u64, stamp: u64) -> Option<u32> {
        let f = stamp as u32;
        ((stamp >> 32) as u32 == self.check(k, f)).then_some(f)
    }

    fn check(&self, k: u64, flush: u32) -> u32 {
        let x = mix(self.store_id ^ mix(k ^ mix(flush as u64 ^ 0x5348_4f41_4c57_414c)));
        (x >> 32) as u32
    }

    /// Lay out `stream` (whole sectors' worth, starting at stream sector `k0`) as stamped
    /// sectors into `out` (exactly `stream.len() / 504 * 512` bytes).
    pub fn stamp_into(&self, k0: u64, flush: u64, stream: &[u8], out: &mut [u8]) {
        assert_eq!(stream.len() as u64 % SECTOR_DATA, 0, "whole sectors only");
        assert_eq!(
            out.len() as u64,
            stream.len() as u64 / SECTOR_DATA * SECTOR,
            "one physical sector per 504 stream bytes"
        );
        for (i, (src, dst)) in stream
            .chunks_exact(SECTOR_DATA as usize)
            .zip(out.chunks_exact_mut(SECTOR as usize))
            .enumerate()
        {
            dst[..STAMP as usize].copy_from_slice(&self.stamp(k0 + i as u64, flush).to_le_bytes());
            dst[STAMP as usize..].copy_from_slice(src);
        }
    }
}

/// A 64-bit finaliser (MurmurHash3's fmix64): every input bit affects every output bit.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// A point in the log: a chunk's LSN, its stream position, and the flush that wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedoPoint {
    pub lsn: u64,
    /// Stream position (since the log's start, never wraps).
    pub fpos: u64,
    /// Number of the flush that wrote the chunk at `fpos` (or, for a fresh or resumed log's
    /// start, the number its first flush will take).
    pub flush: u64,
}

/// The on-disk header: which checkpoint recovery starts from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Header {
    pub format: u32,
    pub seq: u64,
    pub data_bytes: u64,
    pub redo: RedoPoint,
    pub keep: RedoPoint,
    /// CRC of the allocator snapshot written with this header (file `seq % 2`).
    pub alloc_crc: u32,
    /// The id of the store the log belongs to (its superblock's).
    pub store_id: u64,
    /// Every flush so far has a number below this.
    pub next_flush: u64,
    /// Most stream bytes one flush of this run writes (its buffer).
    pub max_flush: u64,
}

impl Header {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK as usize];
        let mut put = |o: usize, v: u64| b[o..o + 8].copy_from_slice(&v.to_le_bytes());
        put(0, HEADER_MAGIC);
        put(16, self.seq);
        put(24, self.data_bytes);
        put(32, self.redo.lsn);
        put(40, self.redo.fpos);
        put(48, self.keep.lsn);
        put(56, self.keep.fpos);
        put(64, self.store_id);
        put(72, self.redo.flush);
        put(80, self.keep.flush);
        put(88, self.next_flush);
        put(96, self.max_flush);
        b[8..12].copy_from_slice(&FORMAT.to_le_bytes());
        b[12..16].copy_from_slice(&self.alloc_crc.to_le_bytes());
        let crc = crc32fast::hash(&b[..104]);
        b[104..108].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decode a header block: `None` if it is not an intact header of any format.
    pub fn decode(b: &[u8]) -> Option<Header> {
        let u64at = |o: usize| LittleEndian::read_u64(&b[o..]);
        let u32at = |o: usize| LittleEndian::read_u32(&b[o..]);
        let format = u32at(8);
        let crc_at = match format {
            1 => 48,
            2 => 64,
            FORMAT => 104,
            _ => return None,
        };
        if u64at(0) != HEADER_MAGIC || crc32fast::hash(&b[..crc_at]) != u32at(crc_at) {
            return None;
        }
        let point = |lsn: usize, fpos: usize, flush: Option<usize>| RedoPoint {
            lsn: u64at(lsn),
            fpos: u64at(fpos),
            flush: flush.map_or(0, u64at),
        };
        let three = format == FORMAT;
        let redo = point(32, 40, three.then_some(72));
        let keep = if format == 1 {
            redo
        } else {
            point(48, 56, three.then_some(80))
        };
        if keep.lsn > redo.lsn || keep.fpos > redo.fpos || keep.flush > redo.flush {
            return None;
        }
        Some(Header {
            format,
            alloc_crc: u32at(12),
            seq: u64at(16),
            data_bytes: u64at(24),
            redo,
            keep,
            store_id: if three { u64at(64) } else { 0 },
            next_flush: if three { u64at(88) } else { 0 },
            max_flush: if three { u64at(96) } else { 0 },
        })
    }
}

/// The allocator snapshot file written with header `seq` (two files, used alternately).
pub(crate) fn alloc_path(path: &Path, seq: u64) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".alloc{}", seq % 2));
    PathBuf::from(s)
}

pub(crate) fn encode_alloc(a: &Allocator) -> Vec<u8> {
    let mut b = Vec::with_capacity(32 + a.free_slots().len() * 8);
    b.extend_from_slice(&ALLOC_MAGIC.to_le_bytes());
    b.extend_from_slice(&a.next_slot().to_le_bytes());
    b.extend_from_slice(&(a.free_slots().len() as u64).to_le_bytes());
    for s in a.free_slots() {
        b.extend_from_slice(&s.to_le_bytes());
    }
    b
}

pub(crate) fn decode_alloc(b: &[u8], capacity: u64) -> Option<Allocator> {
    if b.len() < 24 || LittleEndian::read_u64(&b[0..]) != ALLOC_MAGIC {
        return None;
    }
    let next = LittleEndian::read_u64(&b[8..]);
    let n = LittleEndian::read_u64(&b[16..]) as usize;
    if b.len() != 24 + n * 8 {
        return None;
    }
    let free = (0..n)
        .map(|i| LittleEndian::read_u64(&b[24 + i * 8..]))
        .collect();
    Some(Allocator::new(next, free, capacity))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            data_bytes: 1 << 20,
            store_id: 0x1234_5678_9abc_def0,
        }
    }

    #[test]
    fn a_stamp_is_valid_only_for_its_sector_flush_and_store() {
        let l = layout();
        let s = l.stamp(77, 5);
        assert_eq!(l.stamped_by(77, s), Some(5));
        // the same place one lap later, another sector, another store: not valid
        assert_eq!(l.stamped_by(77 + l.sectors(), s), None);
        assert_eq!(l.stamped_by(78, s), None);
        let other = Layout {
            store_id: 1,
            ..layout()
        };
        assert_eq!(other.stamped_by(77, s), None);
        assert_eq!(l.stamped_by(77, 0), None, "zeros are not a stamp");
        // a flipped bit anywhere in the stamp invalidates it
        for bit in 0..64 {
            assert_eq!(l.stamped_by(77, s ^ (1 << bit)), None, "bit {bit}");
        }
    }

    #[test]
    fn stamped_sectors_carry_the_stream_in_order() {
        let l = layout();
        let stream: Vec<u8> = (0..3 * SECTOR_DATA).map(|i| i as u8).collect();
        let mut out = vec![0u8; 3 * SECTOR as usize];
        l.stamp_into(10, 9, &stream, &mut out);
        for i in 0..3usize {
            let sec = &out[i * SECTOR as usize..(i + 1) * SECTOR as usize];
            let stamp = LittleEndian::read_u64(sec);
            assert_eq!(l.stamped_by(10 + i as u64, stamp), Some(9));
            assert_eq!(
                &sec[8..],
                &stream[i * SECTOR_DATA as usize..(i + 1) * SECTOR_DATA as usize]
            );
        }
    }

    #[test]
    fn headers_round_trip_and_refuse_damage() {
        let h = Header {
            format: FORMAT,
            seq: 3,
            data_bytes: 1 << 20,
            redo: RedoPoint {
                lsn: 9000,
                fpos: 8064,
                flush: 12,
            },
            keep: RedoPoint {
                lsn: 4096,
                fpos: 0,
                flush: 1,
            },
            alloc_crc: 7,
            store_id: 99,
            next_flush: 20,
            max_flush: 1 << 20,
        };
        let b = h.encode();
        let d = Header::decode(&b).unwrap();
        assert_eq!(
            (d.redo, d.keep, d.store_id, d.next_flush),
            (h.redo, h.keep, 99, 20)
        );
        for at in [0, 20, 66, 90, 100] {
            let mut c = b.clone();
            c[at] ^= 4;
            assert!(Header::decode(&c).is_none(), "byte {at}");
        }
    }
}
