//! The superblock: pages 0 and 1 of every device of a store.
//!
//! Every device carries two copies (format 2; format 1 stores have one, at page 0) that differ
//! from the other devices' only in `device_index`, so a device that was swapped, reordered or
//! belongs to another store is detected at open. Each page is sealed like any other page (with
//! the reserved pid [`SUPERBLOCK_PID`]), so a torn or corrupted copy fails its checksum.
//!
//! Every write of the superblocks bumps `generation` and writes copy 0 then copy 1 of each
//! device, each followed by `fdatasync`; a crash therefore leaves at least one intact copy per
//! device, holding either the new or the previous state, and both are states the store went
//! through. At open, [`choose`] takes the intact copy with the highest generation in the whole
//! store as authoritative; a bad or stale copy is reported and rewritten (the open writes every
//! copy). A device whose copies are all bad but still carry the magic is rebuilt from the
//! chosen copy when its file name is the one the superblock records for its position.
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
//! 72  generation       u64      bumped by every write of the superblocks (format 2 on)
//! 80  store_id         u64      random, chosen when the store is created (format 3 on): the
//!                               store's write-ahead log carries it and is refused by others
//! 88  flags            u32      bit 0: the store was last opened with a write-ahead log
//!                               (format 3 on): a missing log is then an error, not "no log"
//! 92  reserved         u32
//! 96  names            device_count x (u16 len, bytes): file names, for error messages
//!                      (at 72 in format 1, at 80 in format 2)
//! ```
//!
//! A format 2 store is rewritten as format 3 (same layout of slots) the first time it is
//! opened, with a new store id; format 1 stores keep their format and have no id (0).

use crate::error::{StoreError, StoreResult};
use crate::page::{seal, verify, PAGE_DATA_SIZE, PAGE_SIZE};
use byteorder::{ByteOrder, LittleEndian};
use std::fmt;
use std::path::Path;

/// Magic bytes at the start of every superblock.
pub const MAGIC: [u8; 8] = *b"SHOALPS\0";
/// Version of the on-disk format written by this code (2: two superblock copies per device;
/// 3: a store id and flags).
pub const FORMAT_VERSION: u32 = 3;
/// `flags` bit: the store was last opened with a write-ahead log.
const FLAG_LOGGED: u32 = 1;
/// The oldest format this code opens (1: one superblock copy per device, slots from page 1).
pub const OLDEST_FORMAT: u32 = 1;
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
    /// Bumped by every write of the superblocks; the highest intact one wins at open.
    pub generation: u64,
    /// Random identity of the store (0: a format 1 or 2 store not yet given one).
    pub store_id: u64,
    /// The store was last opened with a write-ahead log (format 3 on; false before).
    pub logged: bool,
    pub device_names: Vec<String>,
}

/// Pages at the start of each device that hold superblock copies, for a store of format
/// `format_version`: slot rows start after them.
pub fn header_pages(format_version: u32) -> u64 {
    if format_version >= 2 {
        2
    } else {
        1
    }
}

/// Where the names table starts for a format.
fn names_offset(format_version: u32) -> usize {
    match format_version {
        1 => 72,
        2 => 80,
        _ => 96,
    }
}

/// A new random store id (never 0, which means "none").
pub fn new_store_id() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into the buffer we own.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let mut id = u64::from_le_bytes(b);
    if n != b.len() as isize {
        // no entropy source: time and process id are unique enough to tell stores apart
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        id = t ^ ((std::process::id() as u64) << 32);
    }
    id.max(1)
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
        if self.format_version >= 2 {
            put64(page, 72, self.generation);
        }
        if self.format_version >= 3 {
            put64(page, 80, self.store_id);
            put32(page, 88, if self.logged { FLAG_LOGGED } else { 0 });
        }
        let mut off = names_offset(self.format_version);
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
        verify(page, SUPERBLOCK_PID, 0, path).map_err(|e| match e {
            StoreError::Checksum {
                stored, computed, ..
            } => bad(format!(
                "checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): torn or corrupt"
            )),
            StoreError::WrongPage { found, .. } => {
                bad(format!("sealed as page {found:#x}, not as a superblock"))
            }
            e => bad(e.to_string()),
        })?;
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
            generation: 0,
            store_id: 0,
            logged: false,
            device_names: Vec::new(),
        };
        if !(OLDEST_FORMAT..=FORMAT_VERSION).contains(&sb.format_version) {
            return Err(bad(format!(
                "format version {} (this build reads {OLDEST_FORMAT} to {FORMAT_VERSION})",
                sb.format_version
            )));
        }
        let generation = if sb.format_version >= 2 {
            get64(page, 72)
        } else {
            0
        };
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
        let mut off = names_offset(sb.format_version);
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
        let (store_id, logged) = if sb.format_version >= 3 {
            (get64(page, 80), get32(page, 88) & FLAG_LOGGED != 0)
        } else {
            (0, false)
        };
        Ok(Superblock {
            generation,
            store_id,
            logged,
            device_names: names,
            ..sb
        })
    }
}

/// What one superblock copy on a device held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyState {
    /// Intact, of this generation.
    Intact { generation: u64 },
    /// Unreadable, torn, corrupt, or not a superblock: why.
    Bad(String),
}

/// The superblock copies of one device, as [`choose`] found them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceCopies {
    /// One state per copy (one copy in format 1, two in format 2).
    pub copies: Vec<CopyState>,
    /// The copy this device's identity was checked against, or `None` when every copy was bad
    /// and the device was rebuilt from the chosen copy (its file name matched).
    pub used: Option<usize>,
}

impl DeviceCopies {
    /// Some copy is bad or older than `generation` (the chosen one): the next open rewrites it.
    pub fn needs_repair(&self, generation: u64) -> bool {
        self.copies.iter().any(|c| match c {
            CopyState::Intact { generation: g } => *g < generation,
            CopyState::Bad(_) => true,
        })
    }
}

impl fmt::Display for DeviceCopies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, c) in self.copies.iter().enumerate() {
            if k > 0 {
                write!(f, "; ")?;
            }
            match c {
                CopyState::Intact { generation } => write!(f, "copy {k} generation {generation}")?,
                CopyState::Bad(why) => write!(f, "copy {k} bad ({why})")?,
            }
            if self.used == Some(k) {
                write!(f, " (used)")?;
            }
        }
        if self.used.is_none() {
            write!(f, "; rebuilt from another device's copy")?;
        }
        Ok(())
    }
}

/// The superblock a store opens with, and what each device's copies held.
#[derive(Debug, Clone)]
pub struct Chosen {
    /// The intact copy with the highest generation in the store, with `device_index` 0: the
    /// authoritative state.
    pub superblock: Superblock,
    /// Per device, in configured order: its own newest intact copy (or the chosen one rebuilt
    /// for it), for [`crate::store`]'s device-set check.
    pub per_device: Vec<Superblock>,
    /// Per device, in configured order: the state of each copy.
    pub copies: Vec<DeviceCopies>,
}

/// Read every superblock copy of the devices at `paths` (in configured order) and choose the
/// authoritative one. `read(device, page, buf)` fills `buf` with page `page` of a device and
/// returns the number of bytes read (fewer than a page at the end of the file).
///
/// Format 1 devices have one copy (page 1 holds slot data and is not read). A device too short
/// for one page, or whose copies carry no magic at all, is refused as before; a device whose
/// copies are all bad but carry the magic is rebuilt from the chosen copy if its file name is
/// the one recorded for its position.
pub fn choose(
    paths: &[&Path],
    mut read: impl FnMut(usize, u64, &mut [u8; PAGE_SIZE]) -> StoreResult<usize>,
) -> StoreResult<Chosen> {
    assert!(!paths.is_empty(), "a store has at least one device");
    let mut buf = crate::page::AlignedPage::new();
    // per device: each copy's decode result
    let mut found: Vec<Vec<StoreResult<Superblock>>> = Vec::with_capacity(paths.len());
    for (d, path) in paths.iter().enumerate() {
        let n = read(d, 0, &mut buf)?;
        if n < PAGE_SIZE {
            return Err(StoreError::NotAStore {
                path: path.to_path_buf(),
                why: format!("the device is too short for a superblock ({n} bytes)"),
            });
        }
        let first = Superblock::decode(&buf, path);
        let mut copies = vec![first];
        let format_1 = matches!(&copies[0], Ok(sb) if sb.format_version == 1);
        if !format_1 {
            let n = read(d, 1, &mut buf)?;
            let second = if n < PAGE_SIZE {
                Err(StoreError::BadSuperblock {
                    path: path.to_path_buf(),
                    why: format!("copy 1 is cut off ({n} bytes)"),
                })
            } else {
                Superblock::decode(&buf, path).and_then(|sb| {
                    if sb.format_version >= 2 {
                        Ok(sb)
                    } else {
                        Err(StoreError::BadSuperblock {
                            path: path.to_path_buf(),
                            why: "copy 1 says format 1, which has one copy".into(),
                        })
                    }
                })
            };
            copies.push(second);
        }
        found.push(copies);
    }
    // The newest intact copy anywhere (the first of equals, in device and copy order).
    let mut best: Option<&Superblock> = None;
    for sb in found.iter().flatten().flatten() {
        if best.is_none_or(|b| sb.generation > b.generation) {
            best = Some(sb);
        }
    }
    let Some(best) = best else {
        // nothing intact: report device 0's first copy
        let mut first = found.swap_remove(0);
        return Err(first.swap_remove(0).expect_err("no intact copy"));
    };
    let mut chosen = best.clone();
    chosen.device_index = 0;
    let mut per_device = Vec::with_capacity(paths.len());
    let mut states = Vec::with_capacity(paths.len());
    for (d, copies) in found.into_iter().enumerate() {
        let mut used: Option<(usize, &Superblock)> = None;
        for (k, c) in copies.iter().enumerate() {
            if let Ok(sb) = c {
                if used.is_none_or(|(_, u)| sb.generation > u.generation) {
                    used = Some((k, sb));
                }
            }
        }
        let state: Vec<CopyState> = copies
            .iter()
            .map(|c| match c {
                Ok(sb) => CopyState::Intact {
                    generation: sb.generation,
                },
                Err(StoreError::BadSuperblock { why, .. } | StoreError::NotAStore { why, .. }) => {
                    CopyState::Bad(why.clone())
                }
                Err(e) => CopyState::Bad(e.to_string()),
            })
            .collect();
        match used {
            Some((k, sb)) => {
                per_device.push(sb.clone());
                states.push(DeviceCopies {
                    copies: state,
                    used: Some(k),
                });
            }
            None => {
                let carries_magic = copies
                    .iter()
                    .any(|c| matches!(c, Err(StoreError::BadSuperblock { .. })));
                let name = paths[d]
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned());
                let recorded = chosen.device_names.get(d);
                if !carries_magic || name.as_ref() != recorded {
                    let mut copies = copies;
                    return Err(copies.swap_remove(0).expect_err("no intact copy"));
                }
                per_device.push(Superblock {
                    device_index: d as u32,
                    ..chosen.clone()
                });
                states.push(DeviceCopies {
                    copies: state,
                    used: None,
                });
            }
        }
    }
    Ok(Chosen {
        superblock: chosen,
        per_device,
        copies: states,
    })
}

fn put32(p: &mut [u8], off: usize, v: u32) {
    p[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(p: &mut [u8], off: usize, v: u64) {
    p[off..off + 8].copy_from_slice(&v.to_le_bytes());
}
fn get32(p: &[u8], off: usize) -> u32 {
    LittleEndian::read_u32(&p[off..])
}
fn get64(p: &[u8], off: usize) -> u64 {
    LittleEndian::read_u64(&p[off..])
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
            generation: 41,
            store_id: 0x5eed,
            logged: true,
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
