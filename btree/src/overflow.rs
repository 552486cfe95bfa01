//! Values too large for a leaf: a record whose key and value together exceed
//! [`MAX_RECORD`](crate::MAX_RECORD) keeps its value in a chain of overflow pages, and the
//! leaf slot holds a 16-byte reference to it (flag [`FLAG_OVERFLOW`]).
//!
//! ```text
//! reference (the leaf's value bytes): total length u64 | first page u64
//! overflow page: kind u8 = 5 | pad [u8; 3] | bytes here u32 | next page u64 (NO_PAGE: last)
//!                | value bytes (up to PER_PAGE)
//! ```
//!
//! **Writing**: a new value's chain is written before the leaf points at it (last page first,
//! one guard at a time, so a value larger than the cache still fits), and an old value's chain
//! is freed after the leaf stopped pointing at it, once its latch is released. **Reading**
//! happens while the leaf is latched (shared, or optimistic and validated afterwards): a chain
//! is only freed after an exclusive latch on its leaf replaced or removed the reference, so a
//! reader that still sees the reference either holds the leaf (the chain cannot be freed yet)
//! or fails its validation and starts again. A walk never takes more pages than the reference's
//! length needs, so a chain freed and reused under an optimistic reader cannot make it loop.

use crate::node::NO_PAGE;
use byteorder::{ByteOrder, LittleEndian};
use shoal_engine::{EngineError, OpResult, Pid, Restart, Worker, PAGE_DATA_SIZE};

/// Node kind byte of an overflow page.
pub const KIND_OVERFLOW: u8 = 5;
const HEAD: usize = 16;
/// Value bytes per overflow page.
pub const PER_PAGE: usize = PAGE_DATA_SIZE - HEAD;
/// Bytes of a reference in a leaf.
pub const REF_LEN: usize = crate::node::OVERFLOW_REF_LEN;
/// Largest value a tree stores (16 MiB).
pub const MAX_VALUE: usize = 16 << 20;

/// A chain: the value's length and its first page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueRef {
    pub len: u64,
    pub first: Pid,
}

impl ValueRef {
    pub fn encode(&self) -> [u8; REF_LEN] {
        let mut b = [0u8; REF_LEN];
        b[..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..].copy_from_slice(&self.first.raw().to_le_bytes());
        b
    }

    /// The reference in a leaf's value bytes (`None`: not 16 bytes, or an impossible length).
    pub fn decode(b: &[u8]) -> Option<ValueRef> {
        if b.len() != REF_LEN {
            return None;
        }
        let len = LittleEndian::read_u64(b);
        let first = Pid(LittleEndian::read_u64(&b[8..]));
        (len as usize <= MAX_VALUE && first.raw() != NO_PAGE).then_some(ValueRef { len, first })
    }

    /// Pages the chain has.
    pub fn pages(&self) -> usize {
        (self.len as usize).div_ceil(PER_PAGE).max(1)
    }
}

/// Write `value` into a new chain; returns its reference. On failure the pages written so far
/// are freed again.
pub fn write(w: &Worker, value: &[u8]) -> Result<ValueRef, EngineError> {
    assert!(value.len() <= MAX_VALUE, "value size checked by the caller");
    let chunks: Vec<&[u8]> = if value.is_empty() {
        vec![&[][..]]
    } else {
        value.chunks(PER_PAGE).collect()
    };
    let mut next = NO_PAGE;
    // last page first: each page knows its successor when it is written
    for (k, chunk) in chunks.iter().enumerate().rev() {
        let mut g = match w.allocate() {
            Ok(g) => g,
            Err(e) => {
                if next != NO_PAGE {
                    let written = ValueRef {
                        len: (chunks.len() - k - 1) as u64 * PER_PAGE as u64,
                        first: Pid(next),
                    };
                    free_pages(w, written, chunks.len() - k - 1);
                }
                return Err(e);
            }
        };
        g.modify(|b| {
            b[..HEAD].fill(0);
            b[0] = KIND_OVERFLOW;
            b[4..8].copy_from_slice(&(chunk.len() as u32).to_le_bytes());
            b[8..16].copy_from_slice(&next.to_le_bytes());
            b[HEAD..HEAD + chunk.len()].copy_from_slice(chunk);
        });
        next = g.pid().raw();
    }
    Ok(ValueRef {
        len: value.len() as u64,
        first: Pid(next),
    })
}

/// An overflow page's header: (kind, value bytes it holds, next page).
fn header(b: &[u8]) -> (u8, usize, u64) {
    (
        b[0],
        LittleEndian::read_u32(&b[4..]) as usize,
        LittleEndian::read_u64(&b[8..]),
    )
}

/// A chain page that is not what the reference promises.
fn broken(pid: Pid, why: String) -> Restart {
    Restart::Fail(EngineError::Catalog(format!(
        "overflow page {pid} is damaged: {why}"
    )))
}

/// Read the value `r` names into `out` (shared guards, page by page).
pub fn read(w: &Worker, r: ValueRef, out: &mut Vec<u8>) -> OpResult<()> {
    out.clear();
    out.reserve(r.len as usize);
    let mut at = r.first;
    for k in 0..r.pages() {
        let g = w.shared(at)?;
        let b = g.data();
        let (kind, here, next) = header(b);
        if kind != KIND_OVERFLOW || here > PER_PAGE {
            return Err(broken(at, format!("kind {kind}, {here} bytes")));
        }
        if out.len() + here > r.len as usize {
            return Err(broken(
                at,
                format!("the chain holds more than {} bytes", r.len),
            ));
        }
        out.extend_from_slice(&b[HEAD..HEAD + here]);
        let last = k + 1 == r.pages();
        if last != (next == NO_PAGE) {
            return Err(broken(
                at,
                format!("page {} of {} links to {next:#x}", k + 1, r.pages()),
            ));
        }
        at = Pid(next);
    }
    if out.len() != r.len as usize {
        return Err(broken(
            r.first,
            format!("{} bytes, the reference says {}", out.len(), r.len),
        ));
    }
    Ok(())
}

/// Free a chain no leaf points at any more, now (errors are logged: the pages leak).
pub fn free(w: &Worker, r: ValueRef) {
    free_pages(w, r, r.pages());
}

fn free_pages(w: &Worker, r: ValueRef, pages: usize) {
    let mut at = r.first;
    for _ in 0..pages {
        let step = w.run(|w| w.exclusive(at)).and_then(|g| {
            let (kind, _, next) = header(g.data());
            g.free().map(|()| (next, kind == KIND_OVERFLOW))
        });
        match step {
            Ok((next, true)) if next != NO_PAGE => at = Pid(next),
            Ok(_) => return,
            Err(e) => {
                log::warn!("freeing overflow page {at}: {e} (the rest of its chain leaks)");
                return;
            }
        }
    }
}

/// The pages of the chain `r` names, read with `read` (the verifier's and `shoal inspect`'s
/// walk): checks kinds, links and the length.
pub fn chain(
    r: ValueRef,
    mut read: impl FnMut(Pid) -> Result<Box<[u8; PAGE_DATA_SIZE]>, String>,
) -> Result<Vec<Pid>, String> {
    let mut pages = Vec::with_capacity(r.pages());
    let (mut at, mut total) = (r.first, 0usize);
    for k in 0..r.pages() {
        let (kind, here, next) = header(&read(at)?[..]);
        if kind != KIND_OVERFLOW || here > PER_PAGE {
            return Err(format!("overflow page {at}: kind {kind}, {here} bytes"));
        }
        total += here;
        pages.push(at);
        let last = k + 1 == r.pages();
        if last != (next == NO_PAGE) {
            return Err(format!(
                "overflow page {at} (page {} of {}) links to {next:#x}",
                k + 1,
                r.pages()
            ));
        }
        at = Pid(next);
    }
    if total != r.len as usize {
        return Err(format!(
            "overflow chain from {} holds {total} bytes, its reference says {}",
            r.first, r.len
        ));
    }
    Ok(pages)
}
