//! The records inside a chunk's payload: what each kind holds, how to write and read it.
//!
//! Each record is a kind byte ([`rec`]) and a body whose length the kind determines. The log
//! itself only moves chunks; the store replays images, diffs and allocations, and hands undo
//! records to the layer that wrote them.

use crate::page::PAGE_DATA_SIZE;
use byteorder::{ByteOrder, LittleEndian};

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
        if kind == rec::IMAGE || kind == rec::DIFF {
            pages.push(slot_pid(&rest[..len]).1);
        }
        p = &rest[len..];
    }
    pages
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
        LittleEndian::read_u64(&body[0..]),
        LittleEndian::read_u64(&body[8..]),
    )
}
