//! The on-disk page format and aligned page buffers.
//!
//! A page is [`PAGE_SIZE`] bytes. The last [`TRAILER_SIZE`] bytes are the trailer, written by
//! the store when a page is sealed for writing and checked on every read:
//!
//! ```text
//! offset 4080: pid      u64 little endian   which page this slot holds
//! offset 4088: checksum u32 little endian   CRC-32 over bytes 0..4088 (data + pid)
//! offset 4092: magic    u32 little endian   TRAILER_MAGIC (format marker)
//! ```
//!
//! Users of the store (the engine, the B-tree) own bytes `0..PAGE_DATA_SIZE` only.

use crate::error::{StoreError, StoreResult};
use byteorder::{ByteOrder, LittleEndian};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::path::Path;
use std::ptr::NonNull;

/// Size of a page in memory and on disk.
pub const PAGE_SIZE: usize = 4096;
/// Bytes at the end of every page reserved for the store's trailer.
pub const TRAILER_SIZE: usize = 16;
/// Bytes of a page that belong to its user.
pub const PAGE_DATA_SIZE: usize = PAGE_SIZE - TRAILER_SIZE;
/// Marks a sealed page of this format.
pub const TRAILER_MAGIC: u32 = 0x5348_4c31; // "SHL1"

const PID_OFF: usize = PAGE_DATA_SIZE;
const SUM_OFF: usize = PAGE_DATA_SIZE + 8;
const MAGIC_OFF: usize = PAGE_DATA_SIZE + 12;

/// Checksum of a page image: CRC-32 over the data area and the pid field.
pub fn checksum(page: &[u8; PAGE_SIZE]) -> u32 {
    crc32fast::hash(&page[..SUM_OFF])
}

/// Write the trailer (pid, checksum, magic) into a page image, making it ready to be written.
pub fn seal(page: &mut [u8; PAGE_SIZE], pid: u64) {
    page[PID_OFF..PID_OFF + 8].copy_from_slice(&pid.to_le_bytes());
    let sum = checksum(page);
    page[SUM_OFF..SUM_OFF + 4].copy_from_slice(&sum.to_le_bytes());
    page[MAGIC_OFF..MAGIC_OFF + 4].copy_from_slice(&TRAILER_MAGIC.to_le_bytes());
}

/// Check a page image read from `slot` of `path` against the page id it should hold.
pub fn verify(
    page: &[u8; PAGE_SIZE],
    expected_pid: u64,
    slot: u64,
    path: &Path,
) -> StoreResult<()> {
    let stored = LittleEndian::read_u32(&page[SUM_OFF..]);
    let magic = LittleEndian::read_u32(&page[MAGIC_OFF..]);
    let computed = checksum(page);
    if stored != computed || magic != TRAILER_MAGIC {
        return Err(StoreError::Checksum {
            pid: expected_pid,
            slot,
            path: path.to_path_buf(),
            stored,
            computed,
        });
    }
    let found = LittleEndian::read_u64(&page[PID_OFF..]);
    if found != expected_pid {
        return Err(StoreError::WrongPage {
            expected: expected_pid,
            found,
            slot,
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// A heap buffer of one page, aligned to [`PAGE_SIZE`] as O_DIRECT requires.
pub struct AlignedPage {
    ptr: NonNull<[u8; PAGE_SIZE]>,
}

// SAFETY: AlignedPage uniquely owns its allocation, like Box<[u8; PAGE_SIZE]>.
unsafe impl Send for AlignedPage {}
// SAFETY: shared access only hands out `&[u8; PAGE_SIZE]`; mutation needs `&mut self`.
unsafe impl Sync for AlignedPage {}

impl AlignedPage {
    const LAYOUT: Layout = match Layout::from_size_align(PAGE_SIZE, PAGE_SIZE) {
        Ok(l) => l,
        Err(_) => panic!("page layout"),
    };

    /// A zeroed, aligned page buffer.
    pub fn new() -> Self {
        // SAFETY: LAYOUT has non-zero size.
        let raw = unsafe { alloc_zeroed(Self::LAYOUT) };
        let ptr = NonNull::new(raw.cast::<[u8; PAGE_SIZE]>())
            .unwrap_or_else(|| std::alloc::handle_alloc_error(Self::LAYOUT));
        AlignedPage { ptr }
    }

    /// Raw pointer to the first byte (for I/O submission).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr().cast()
    }
}

impl Default for AlignedPage {
    fn default() -> Self {
        Self::new()
    }
}

impl std::ops::Deref for AlignedPage {
    type Target = [u8; PAGE_SIZE];
    fn deref(&self) -> &Self::Target {
        // SAFETY: ptr is a live, initialised (zeroed at allocation) and uniquely owned buffer.
        unsafe { self.ptr.as_ref() }
    }
}

impl std::ops::DerefMut for AlignedPage {
    fn deref_mut(&mut self) -> &mut Self::Target {
        // SAFETY: as in Deref; `&mut self` guarantees exclusive access.
        unsafe { self.ptr.as_mut() }
    }
}

impl Drop for AlignedPage {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated with LAYOUT by `new` and is freed exactly once.
        unsafe { dealloc(self.ptr.as_ptr().cast(), Self::LAYOUT) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_then_verify_roundtrip_and_detects_flips() {
        let mut p = AlignedPage::new();
        p[0] = 7;
        p[100] = 9;
        seal(&mut p, 42);
        verify(&p, 42, 3, Path::new("x")).unwrap();
        assert!(matches!(
            verify(&p, 43, 3, Path::new("x")),
            Err(StoreError::WrongPage {
                expected: 43,
                found: 42,
                ..
            })
        ));
        p[100] ^= 1;
        let err = verify(&p, 42, 3, Path::new("x")).unwrap_err();
        assert!(err.to_string().contains("0x2a"), "{err}");
        assert!(matches!(err, StoreError::Checksum { pid: 42, .. }));
    }

    #[test]
    fn zero_page_fails_verification() {
        let p = AlignedPage::new();
        assert!(verify(&p, 0, 0, Path::new("x")).is_err());
    }

    #[test]
    fn aligned() {
        let mut p = AlignedPage::new();
        assert_eq!(p.as_mut_ptr() as usize % PAGE_SIZE, 0);
    }
}
