//! The records inside a chunk's payload: what each kind holds, how to write and read it.
//!
//! Each record is a kind byte ([`rec`]) and a body whose length the kind determines. The log
//! itself only moves chunks; the store replays images, diffs and allocations, and hands undo
//! records to the layer that wrote them.

use crate::page::PAGE_DATA_SIZE;
use byteorder::{ByteOrder, LittleEndian};

/// Record kinds (the first byte of each record in a chunk's payload).
pub mod rec {
    /// A whole page of an older build (no version): slot u64, pid u64, `PAGE_DATA_SIZE` bytes.
    pub const OLD_IMAGE: u8 = 1;
    /// Changed byte ranges of a page of an older build (no version): slot u64, pid u64, count
    /// u16, then per range off u16, len u16 and the bytes.
    pub const OLD_DIFF: u8 = 2;
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
    /// A whole page: slot u64, pid u64, version u64 (the page's version after this change),
    /// `PAGE_DATA_SIZE` bytes.
    pub const IMAGE: u8 = 8;
    /// Changed byte ranges of a page: slot u64, pid u64, version u64 (after the change; the
    /// ranges apply to the page at version - 1), count u16, then per range off u16, len u16
    /// and the bytes.
    pub const DIFF: u8 = 9;
}

/// A page's record, read back: which page, its version after the change, and the change.
#[derive(Debug, Clone, Copy)]
pub struct PageRecord<'a> {
    pub slot: u64,
    pub pid: u64,
    /// The page's version after the change (0: a record of an older build, which has none).
    pub version: u64,
    pub change: Change<'a>,
}

/// What a page record changes.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// The whole data area.
    Image(&'a [u8]),
    /// Changed ranges: count u16, then per range off u16, len u16 and the bytes (checked by
    /// [`body_len`] when the chunk was split).
    Diff(&'a [u8]),
}

impl Change<'_> {
    /// Apply the change to a page's data area.
    pub fn apply(&self, page: &mut [u8]) {
        match self {
            Change::Image(d) => page[..PAGE_DATA_SIZE].copy_from_slice(d),
            Change::Diff(r) => apply_ranges(r, page),
        }
    }
}

/// The page record a body of `kind` holds (None: the record is not about a page).
pub fn page_record(kind: u8, body: &[u8]) -> Option<PageRecord<'_>> {
    let (slot, pid) = (
        LittleEndian::read_u64(body.get(0..8)?),
        LittleEndian::read_u64(body.get(8..16)?),
    );
    let (version, change) = match kind {
        rec::OLD_IMAGE => (0, Change::Image(body.get(16..16 + PAGE_DATA_SIZE)?)),
        rec::OLD_DIFF => (0, Change::Diff(body.get(16..)?)),
        rec::IMAGE => (
            LittleEndian::read_u64(body.get(16..24)?),
            Change::Image(body.get(24..24 + PAGE_DATA_SIZE)?),
        ),
        rec::DIFF => (
            LittleEndian::read_u64(body.get(16..24)?),
            Change::Diff(body.get(24..)?),
        ),
        _ => return None,
    };
    Some(PageRecord {
        slot,
        pid,
        version,
        change,
    })
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

/// Append a whole-page record to a chunk being built: the page at `version`.
pub fn put_image(buf: &mut Vec<u8>, slot: u64, pid: u64, version: u64, data: &[u8]) {
    assert_eq!(
        data.len(),
        PAGE_DATA_SIZE,
        "a page image is the whole data area"
    );
    buf.push(rec::IMAGE);
    buf.extend_from_slice(&slot.to_le_bytes());
    buf.extend_from_slice(&pid.to_le_bytes());
    buf.extend_from_slice(&version.to_le_bytes());
    buf.extend_from_slice(data);
}

/// Append a changed-ranges record: `ranges` are (offset, length) into `page` (the data area),
/// which is at `version` after the change.
pub fn put_diff(
    buf: &mut Vec<u8>,
    slot: u64,
    pid: u64,
    version: u64,
    ranges: impl ExactSizeIterator<Item = (u16, u16)>,
    page: &[u8],
) {
    buf.push(rec::DIFF);
    buf.extend_from_slice(&slot.to_le_bytes());
    buf.extend_from_slice(&pid.to_le_bytes());
    buf.extend_from_slice(&version.to_le_bytes());
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
pub const IMAGE_RECORD: usize = 25 + PAGE_DATA_SIZE;

/// Split a chunk's payload into its records, `(kind, body start, body end)` into `out`
/// (cleared first): all of them or an error, so that a chunk is applied whole or not at all.
pub(crate) fn split_records(
    payload: &[u8],
    out: &mut Vec<(u8, usize, usize)>,
) -> Result<(), String> {
    out.clear();
    let mut at = 0;
    while let Some(&kind) = payload.get(at) {
        let len = body_len(kind, &payload[at + 1..])?;
        out.push((kind, at + 1, at + 1 + len));
        at += 1 + len;
    }
    Ok(())
}

/// The length of the body of a record of `kind` that begins `rest` (checked to fit in it).
pub(crate) fn body_len(kind: u8, rest: &[u8]) -> Result<usize, String> {
    let len = match kind {
        rec::OLD_IMAGE => 16 + PAGE_DATA_SIZE,
        rec::IMAGE => 24 + PAGE_DATA_SIZE,
        rec::OLD_DIFF | rec::DIFF => {
            let head = if kind == rec::DIFF { 24 } else { 16 };
            if rest.len() < head + 2 {
                return Err("short diff record".into());
            }
            let count = u16::from_le_bytes([rest[head], rest[head + 1]]) as usize;
            let mut l = head + 2;
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
            12 + LittleEndian::read_u32(&rest[8..]) as usize
        }
        k => return Err(format!("unknown record kind {k}")),
    };
    if rest.len() < len {
        return Err(format!("record of kind {kind} cut short"));
    }
    Ok(len)
}

/// The page ids that the image and diff records at the start of `payload` name, as far as
/// the records parse (for naming what a damaged chunk touched).
pub(crate) fn pages_named(mut p: &[u8]) -> Vec<u64> {
    let mut pages = Vec::new();
    while let Some((&kind, rest)) = p.split_first() {
        let Ok(len) = body_len(kind, rest) else {
            break;
        };
        if let Some(r) = page_record(kind, &rest[..len]) {
            pages.push(r.pid);
        }
        p = &rest[len..];
    }
    pages
}

/// Apply a diff's ranges (count u16, then the ranges; checked by [`body_len`]) to a page's
/// data area.
fn apply_ranges(body: &[u8], page: &mut [u8]) {
    let count = u16::from_le_bytes([body[0], body[1]]) as usize;
    let mut l = 2;
    for _ in 0..count {
        let off = u16::from_le_bytes([body[l], body[l + 1]]) as usize;
        let len = u16::from_le_bytes([body[l + 2], body[l + 3]]) as usize;
        page[off..off + len].copy_from_slice(&body[l + 4..l + 4 + len]);
        l += 4 + len;
    }
}
