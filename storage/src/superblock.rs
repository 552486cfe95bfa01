//! The superblock: page 0 of every device of a store.
//!
//! Every device carries a copy that differs only in `device_index`, so a device that was
//! swapped, reordered or belongs to another store is detected at open. Device 0's copy is
//! authoritative for the allocator state. The page is sealed like any other page (with the
//! reserved pid [`SUPERBLOCK_PID`]), so a torn or corrupted superblock fails its checksum.
//!
//! Layout (little endian) inside the page's data area:
//!
//! ```text
//!  0  magic            [u8; 8]  b"SHOALPS\0"
//!  8  format_version   u32
//! 12  page_size        u32
//! 16  cluster_id       u64
//! 24  node_id          u32
//! 28  device_count     u32
//! 32  device_index     u32
//! 36  clean            u32      1 = closed cleanly, 0 = open or crashed
//! 40  next_slot        u64      allocator high-water mark
//! 48  freelist_head    u64      first free-list page (a free slot), u64::MAX = none
//! 56  freelist_len     u64      number of free slots recorded in the chain
//! 64  capacity         u64      maximum slots, 0 = unlimited
//! 72  names            device_count x (u16 len, bytes): file names, for error messages
//! ```

use crate::error::{StoreError, StoreResult};
use crate::page::{seal, verify, PAGE_DATA_SIZE, PAGE_SIZE};
use std::path::Path;

/// Magic bytes at the start of every superblock.
pub const MAGIC: [u8; 8] = *b"SHOALPS\0";
/// Version of the on-disk format written by this code.
pub const FORMAT_VERSION: u32 = 1;
/// Reserved page id sealed into superblocks.
pub const SUPERBLOCK_PID: u64 = u64::MAX;
/// Reserved page id sealed into free-list pages.
pub const FREELIST_PID: u64 = u64::MAX - 1;
/// Longest device name recorded.
const MAX_NAME: usize = 255;

/// Decoded superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub format_version: u32,
    pub page_size: u32,
    pub cluster_id: u64,
    pub node_id: u32,
    pub device_count: u32,
    pub device_index: u32,
    pub clean: bool,
    pub next_slot: u64,
    pub freelist_head: u64,
    pub freelist_len: u64,
    pub capacity: u64,
    pub device_names: Vec<String>,
}

impl Superblock {
    /// Serialise and seal into a page image.
    pub fn encode(&self, page: &mut [u8; PAGE_SIZE]) -> StoreResult<()> {
        page.fill(0);
        page[0..8].copy_from_slice(&MAGIC);
        put32(page, 8, self.format_version);
        put32(page, 12, self.page_size);
        put64(page, 16, self.cluster_id);
        put32(page, 24, self.node_id);
        put32(page, 28, self.device_count);
        put32(page, 32, self.device_index);
        put32(page, 36, self.clean as u32);
        put64(page, 40, self.next_slot);
        put64(page, 48, self.freelist_head);
        put64(page, 56, self.freelist_len);
        put64(page, 64, self.capacity);
        let mut off = 72;
        for name in &self.device_names {
            let bytes = &name.as_bytes()[..name.len().min(MAX_NAME)];
            if off + 2 + bytes.len() > PAGE_DATA_SIZE {
                return Err(StoreError::Config(
                    "too many devices or names too long for the superblock".into(),
                ));
            }
            page[off..off + 2].copy_from_slice(&(bytes.len() as u16).to_le_bytes());
            page[off + 2..off + 2 + bytes.len()].copy_from_slice(bytes);
            off += 2 + bytes.len();
        }
        seal(page, SUPERBLOCK_PID);
        Ok(())
    }

    /// Verify and decode a page image read from device `path`.
    pub fn decode(page: &[u8; PAGE_SIZE], path: &Path) -> StoreResult<Superblock> {
        let bad = |why: String| StoreError::BadSuperblock {
            path: path.to_path_buf(),
            why,
        };
        if page[0..8] != MAGIC {
            return Err(StoreError::NotAStore {
                path: path.to_path_buf(),
                why: "no Shoal superblock (wrong magic)".into(),
            });
        }
        verify(page, SUPERBLOCK_PID, 0, path).map_err(|e| bad(e.to_string()))?;
        let sb = Superblock {
            format_version: get32(page, 8),
            page_size: get32(page, 12),
            cluster_id: get64(page, 16),
            node_id: get32(page, 24),
            device_count: get32(page, 28),
            device_index: get32(page, 32),
            clean: get32(page, 36) == 1,
            next_slot: get64(page, 40),
            freelist_head: get64(page, 48),
            freelist_len: get64(page, 56),
            capacity: get64(page, 64),
            device_names: Vec::new(),
        };
        if sb.format_version != FORMAT_VERSION {
            return Err(bad(format!(
                "format version {} (this build reads {FORMAT_VERSION})",
                sb.format_version
            )));
        }
        if sb.page_size as usize != PAGE_SIZE {
            return Err(bad(format!(
                "page size {} (this build uses {PAGE_SIZE})",
                sb.page_size
            )));
        }
        if sb.device_count == 0 || sb.device_index >= sb.device_count {
            return Err(bad(format!(
                "device index {} of {} devices",
                sb.device_index, sb.device_count
            )));
        }
        let mut names = Vec::with_capacity(sb.device_count as usize);
        let mut off = 72;
        for _ in 0..sb.device_count {
            if off + 2 > PAGE_DATA_SIZE {
                return Err(bad("device name table overruns the page".into()));
            }
            let len = u16::from_le_bytes([page[off], page[off + 1]]) as usize;
            if len > MAX_NAME || off + 2 + len > PAGE_DATA_SIZE {
                return Err(bad("device name table overruns the page".into()));
            }
            names.push(String::from_utf8_lossy(&page[off + 2..off + 2 + len]).into_owned());
            off += 2 + len;
        }
        Ok(Superblock {
            device_names: names,
            ..sb
        })
    }
}

fn put32(p: &mut [u8], off: usize, v: u32) {
    p[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(p: &mut [u8], off: usize, v: u64) {
    p[off..off + 8].copy_from_slice(&v.to_le_bytes());
}
fn get32(p: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(p[off..off + 4].try_into().expect("4 bytes"))
}
fn get64(p: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(p[off..off + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::AlignedPage;

    fn sample() -> Superblock {
        Superblock {
            format_version: FORMAT_VERSION,
            page_size: PAGE_SIZE as u32,
            cluster_id: 77,
            node_id: 3,
            device_count: 2,
            device_index: 1,
            clean: true,
            next_slot: 1234,
            freelist_head: 17,
            freelist_len: 9,
            capacity: 0,
            device_names: vec!["a.dat".into(), "b.dat".into()],
        }
    }

    #[test]
    fn roundtrip() {
        let mut p = AlignedPage::new();
        sample().encode(&mut p).unwrap();
        assert_eq!(Superblock::decode(&p, Path::new("d")).unwrap(), sample());
    }

    #[test]
    fn corruption_and_foreign_data_are_errors() {
        let mut p = AlignedPage::new();
        assert!(matches!(
            Superblock::decode(&p, Path::new("d")),
            Err(StoreError::NotAStore { .. })
        ));
        sample().encode(&mut p).unwrap();
        p[44] ^= 0xff;
        assert!(matches!(
            Superblock::decode(&p, Path::new("d")),
            Err(StoreError::BadSuperblock { .. })
        ));
    }
}
