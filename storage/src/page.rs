//! The on-disk page format and aligned page buffers.
//!
//! A page is [`PAGE_SIZE`] bytes. The last [`TRAILER_SIZE`] bytes are the trailer. Format 2
//! (this build writes it):
//!
//! ```text
//! offset 4080: version  u64 little endian   the page's version (below); the engine's, kept as is
//! offset 4088: checksum u32 little endian   CRC-32 over bytes 0..4088 (data + version), then
//!                                           the 8 bytes of the page id the slot should hold
//! offset 4092: tag      u16 little endian   the low 16 bits of the page id (for naming a misplaced page)
//! offset 4094: magic    u16 little endian   TRAILER_MAGIC (format marker)
//! ```
//!
//! The **version** counts the page's logged changes: the engine bumps it with every change it
//! logs and keeps it in the page's own bytes, so it travels with the page wherever the page goes
//! (between nodes, into the store) and tells recovery which of several records or copies of a
//! page is the newest (docs/durability.md, "Clusters"). The page id is checked through the
//! checksum (a page written to the wrong slot fails it); its low 16 bits are stored, so that a
//! misplaced page of a nearby slot can be named ([`StoreError::WrongPage`]).
//!
//! Format 1 (older builds) had the page id at 4080 and [`OLD_TRAILER_MAGIC`]; such pages are
//! read as version 0 and rewritten in format 2 at their next write-back.
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
/// Marks a sealed page of format 2 (with a version), in the trailer's last two bytes.
pub const TRAILER_MAGIC: u16 = 0x5332; // "2S"
/// Marks a sealed page of format 1 (page id where the version is now).
pub const OLD_TRAILER_MAGIC: u32 = 0x5348_4c31; // "SHL1"

/// Where a page keeps its version.
pub const VERSION_OFF: usize = PAGE_DATA_SIZE;
const SUM_OFF: usize = PAGE_DATA_SIZE + 8;
const TAG_OFF: usize = PAGE_DATA_SIZE + 12;
const MAGIC_OFF: usize = PAGE_DATA_SIZE + 14;
/// Format 1's magic was a u32 here.
const OLD_MAGIC_OFF: usize = PAGE_DATA_SIZE + 12;

/// The version a page image carries (format 2; see the module's doc).
pub fn version(page: &[u8; PAGE_SIZE]) -> u64 {
    LittleEndian::read_u64(&page[VERSION_OFF..])
}

/// Set the version of a page image.
pub fn set_version(page: &mut [u8; PAGE_SIZE], v: u64) {
    LittleEndian::write_u64(&mut page[VERSION_OFF..], v);
}

/// Checksum of a page image that should be page `pid`: CRC-32 over the data area and the
/// version, then the page id.
pub fn checksum(page: &[u8; PAGE_SIZE], pid: u64) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&page[..SUM_OFF]);
    h.update(&pid.to_le_bytes());
    h.finalize()
}

/// Write the trailer (checksum, magic) of page `pid` into a page image, making it ready to be
/// written. The version is the page's own (left as it is).
pub fn seal(page: &mut [u8; PAGE_SIZE], pid: u64) {
    let sum = checksum(page, pid);
    page[SUM_OFF..SUM_OFF + 4].copy_from_slice(&sum.to_le_bytes());
    page[TAG_OFF..TAG_OFF + 2].copy_from_slice(&(pid as u16).to_le_bytes());
    page[MAGIC_OFF..MAGIC_OFF + 2].copy_from_slice(&TRAILER_MAGIC.to_le_bytes());
}

fn is_old_format(page: &[u8; PAGE_SIZE]) -> bool {
    LittleEndian::read_u32(&page[OLD_MAGIC_OFF..]) == OLD_TRAILER_MAGIC
}

/// Check a page image read from `slot` of `path` against the page id it should hold. A page
/// of format 1 is accepted with its own check; its version field then still holds its page
/// id ([`verify_and_upgrade`] clears it).
pub fn verify(
    page: &[u8; PAGE_SIZE],
    expected_pid: u64,
    slot: u64,
    path: &Path,
) -> StoreResult<()> {
    if is_old_format(page) {
        return verify_old(page, expected_pid, slot, path);
    }
    let stored = LittleEndian::read_u32(&page[SUM_OFF..]);
    let magic = LittleEndian::read_u16(&page[MAGIC_OFF..]);
    let computed = checksum(page, expected_pid);
    if stored != computed || magic != TRAILER_MAGIC {
        // a page of a nearby slot (same high bits, the stored tag) that is intact: misplaced
        let tag = LittleEndian::read_u16(&page[TAG_OFF..]) as u64;
        let found = (expected_pid & !0xffff) | tag;
        if magic == TRAILER_MAGIC && found != expected_pid && checksum(page, found) == stored {
            return Err(StoreError::WrongPage {
                expected: expected_pid,
                found,
                slot,
                path: path.to_path_buf(),
            });
        }
        return Err(StoreError::Checksum {
            pid: expected_pid,
            slot,
            path: path.to_path_buf(),
            stored,
            computed,
        });
    }
    Ok(())
}

/// [`verify`], then a page of format 1 gets version 0 (its page id leaves the version field).
pub fn verify_and_upgrade(
    page: &mut [u8; PAGE_SIZE],
    expected_pid: u64,
    slot: u64,
    path: &Path,
) -> StoreResult<()> {
    verify(page, expected_pid, slot, path)?;
    if is_old_format(page) {
        set_version(page, 0);
    }
    Ok(())
}

/// Format 1: the page id at 4080, the checksum over bytes 0..4088.
fn verify_old(
    page: &[u8; PAGE_SIZE],
    expected_pid: u64,
    slot: u64,
    path: &Path,
) -> StoreResult<()> {
    let stored = LittleEndian::read_u32(&page[SUM_OFF..]);
    let computed = crc32fast::hash(&page[..SUM_OFF]);
    if stored != computed {
        return Err(StoreError::Checksum {
            pid: expected_pid,
            slot,
            path: path.to_path_buf(),
            stored,
            computed,
        });
    }
    let found = LittleEndian::read_u64(&page[VERSION_OFF..]);
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
    fn a_sealed_page_verifies_keeps_its_version_and_fails_when_flipped_or_misplaced() {
        let mut p = AlignedPage::new();
        p[0] = 7;
        p[100] = 9;
        set_version(&mut p, 77);
        seal(&mut p, 42);
        verify(&p, 42, 3, Path::new("x")).unwrap();
        assert_eq!(version(&p), 77, "sealing keeps the version");
        // a page in the wrong slot fails its checksum (the page id is part of it), and one of
        // a nearby slot is named
        assert!(matches!(
            verify(&p, 43, 3, Path::new("x")),
            Err(StoreError::WrongPage {
                expected: 43,
                found: 42,
                ..
            })
        ));
        assert!(matches!(
            verify(&p, 42 + (1 << 20), 3, Path::new("x")),
            Err(StoreError::Checksum { .. })
        ));
        // the version is covered too
        set_version(&mut p, 78);
        assert!(verify(&p, 42, 3, Path::new("x")).is_err());
        set_version(&mut p, 77);
        p[100] ^= 1;
        let err = verify(&p, 42, 3, Path::new("x")).unwrap_err();
        assert!(err.to_string().contains("0x2a"), "{err}");
        assert!(matches!(err, StoreError::Checksum { pid: 42, .. }));
    }

    /// A page as format 1 wrote it: page id at 4080, CRC over 0..4088, the old magic.
    fn old_format(page: &mut [u8; PAGE_SIZE], pid: u64) {
        LittleEndian::write_u64(&mut page[VERSION_OFF..], pid);
        let sum = crc32fast::hash(&page[..SUM_OFF]);
        LittleEndian::write_u32(&mut page[SUM_OFF..], sum);
        LittleEndian::write_u32(&mut page[OLD_MAGIC_OFF..], OLD_TRAILER_MAGIC);
    }

    #[test]
    fn a_page_of_the_older_format_is_read_as_version_zero_and_checked_as_before() {
        let mut p = AlignedPage::new();
        p[5] = 1;
        old_format(&mut p, 42);
        assert!(matches!(
            verify(&p, 43, 3, Path::new("x")),
            Err(StoreError::WrongPage {
                expected: 43,
                found: 42,
                ..
            })
        ));
        verify_and_upgrade(&mut p, 42, 3, Path::new("x")).unwrap();
        assert_eq!(version(&p), 0);
        p[5] = 2;
        assert!(verify(&p, 42, 3, Path::new("x")).is_err());
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
