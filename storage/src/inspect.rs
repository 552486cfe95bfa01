//! Read-only inspection of a page store (what `shoal inspect` reports for one node).
//!
//! [`StoreReader`] opens a store's devices read-only: it never writes a byte, never changes the
//! clean flag, and works on a store that was not shut down cleanly. It checks the superblocks
//! as [`crate::PageStore::open`] does, reads the free list of a clean store, reads single pages
//! (verified like the store's own reads), and [`StoreReader::scan`]s every slot below the
//! allocator's mark, sorting each into free, intact, never written or corrupt.
//!
//! Reads go through the page cache (no O_DIRECT, no io_uring): the scan reads each device
//! sequentially in large chunks, which is what a buffered read does best.

use crate::error::{StoreError, StoreResult};
use crate::page::{verify, PAGE_SIZE};
use crate::store::{
    check_device_set, device_bytes_needed, mark_from_lengths, walk_freelist, MAX_DEVICES,
};
use crate::superblock::{self, header_pages, DeviceCopies, Superblock, FREELIST_PID};
use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Pages read per chunk while scanning a device.
const SCAN_CHUNK_PAGES: usize = 64;
/// Most corrupt or never-written slots a scan lists one by one (all are counted).
pub const MAX_LISTED: usize = 100;

/// A store opened for reading only.
pub struct StoreReader {
    devices: Vec<(PathBuf, File)>,
    superblock: Superblock,
    copies: Vec<DeviceCopies>,
    header: u64,
    lens: Vec<u64>,
}

/// What a scan of every slot found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotScan {
    /// Slots looked at: `0..slots`.
    pub slots: u64,
    /// Slots on the free list (not read: a free slot may hold anything).
    pub free: u64,
    /// Slots in use holding a sealed page whose checksum and page id are right.
    pub intact: u64,
    /// Slots in use with no page image (all zero, or beyond the end of the device).
    pub never_written: u64,
    /// The first [`MAX_LISTED`] never-written slots.
    pub never_written_slots: Vec<u64>,
    /// Number of corrupt slots (bad checksum or trailer, wrong page id, read error).
    pub corrupt: u64,
    /// The first [`MAX_LISTED`] corrupt slots, each with what is wrong.
    pub corrupt_slots: Vec<(u64, String)>,
}

impl StoreReader {
    /// Open the devices of one store, in stripe order, and check their superblocks.
    pub fn open(paths: &[PathBuf]) -> StoreResult<StoreReader> {
        if paths.is_empty() || paths.len() > MAX_DEVICES {
            return Err(StoreError::Config(format!(
                "a store has 1 to {MAX_DEVICES} devices, got {}",
                paths.len()
            )));
        }
        let mut devices = Vec::with_capacity(paths.len());
        let mut lens = Vec::with_capacity(paths.len());
        for p in paths {
            let io = |source| StoreError::Io {
                path: p.clone(),
                source,
            };
            let f = File::open(p).map_err(io)?;
            let len = f.metadata().map_err(io)?.len();
            devices.push((p.clone(), f));
            lens.push(len);
        }
        let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        let chosen = superblock::choose(&refs, |d, page, buf| {
            let (path, f) = &devices[d];
            read_full(f, page * PAGE_SIZE as u64, &mut buf[..]).map_err(|source| StoreError::Io {
                path: path.clone(),
                source,
            })
        })?;
        check_device_set(&chosen.per_device, &refs)?;
        Ok(StoreReader {
            devices,
            header: header_pages(chosen.superblock.format_version),
            superblock: chosen.superblock,
            copies: chosen.copies,
            lens,
        })
    }

    /// The authoritative superblock: the intact copy with the highest generation.
    pub fn superblock(&self) -> &Superblock {
        &self.superblock
    }

    /// Per device, in stripe order: what each superblock copy held and which was used.
    pub fn superblock_copies(&self) -> &[DeviceCopies] {
        &self.copies
    }

    /// Bytes in each device, in stripe order.
    pub fn device_bytes(&self) -> &[u64] {
        &self.lens
    }

    /// Devices shorter than the slots below the superblock's allocator mark need: (path,
    /// bytes, bytes needed). A file cut short has lost pages. (Block devices are not checked.)
    pub fn short_devices(&self) -> Vec<(PathBuf, u64, u64)> {
        let n = self.devices.len() as u64;
        self.devices
            .iter()
            .zip(&self.lens)
            .enumerate()
            .filter(|(_, ((_, f), _))| f.metadata().is_ok_and(|m| m.file_type().is_file()))
            .filter_map(|(i, ((p, _), &len))| {
                let need = device_bytes_needed(self.superblock.next_slot, n, i as u64, self.header);
                (len < need).then(|| (p.clone(), len, need))
            })
            .collect()
    }

    /// Slots that may hold pages: the recorded mark of a clean store; for an unclean one,
    /// every slot the devices have room for (as an unclean open would assume).
    pub fn slot_limit(&self) -> u64 {
        if self.superblock.clean {
            self.superblock.next_slot
        } else {
            mark_from_lengths(self.superblock.next_slot, &self.lens, self.header)
        }
    }

    /// The free slots of a clean store (free-list pages included; they live in free slots).
    /// `None` for an unclean store: its recorded free list is stale and was not kept.
    pub fn free_slots(&self) -> StoreResult<Option<Vec<u64>>> {
        let sb = &self.superblock;
        if !sb.clean {
            return Ok(None);
        }
        walk_freelist(
            sb.freelist_head,
            sb.freelist_len,
            &self.devices[0].0,
            |slot, buf| {
                let page = self.read(slot, FREELIST_PID)?;
                buf.copy_from_slice(&page[..]);
                Ok(())
            },
        )
        .map(Some)
    }

    /// Which device and byte offset hold `slot`.
    fn location(&self, slot: u64) -> (usize, u64) {
        let n = self.devices.len() as u64;
        (
            (slot % n) as usize,
            (self.header + slot / n) * PAGE_SIZE as u64,
        )
    }

    /// Read the page in `slot` and verify that it is intact and holds `pid`.
    pub fn read(&self, slot: u64, pid: u64) -> StoreResult<Box<[u8; PAGE_SIZE]>> {
        let (dev, off) = self.location(slot);
        let (path, f) = &self.devices[dev];
        let mut page = Box::new([0u8; PAGE_SIZE]);
        let got = read_full(f, off, &mut page[..]).map_err(|source| StoreError::Io {
            path: path.clone(),
            source,
        })?;
        classify(&page, got, pid, slot, path)?;
        Ok(page)
    }

    /// Read every slot below [`Self::slot_limit`] except those in `free`, and verify each
    /// against `pid_of(slot)`. `progress(slots_done)` is called after each chunk.
    pub fn scan(
        &self,
        free: &HashSet<u64>,
        pid_of: impl Fn(u64) -> u64,
        mut progress: impl FnMut(u64),
    ) -> SlotScan {
        let limit = self.slot_limit();
        let n = self.devices.len() as u64;
        let mut out = SlotScan {
            slots: limit,
            ..SlotScan::default()
        };
        let mut buf = vec![0u8; SCAN_CHUNK_PAGES * PAGE_SIZE];
        let mut done = 0u64;
        for (dev, (path, f)) in self.devices.iter().enumerate() {
            // Slots dev, dev + n, dev + 2n, ... sit one after another after the superblocks.
            let on_device = limit.saturating_sub(dev as u64).div_ceil(n);
            let mut row = 0u64;
            while row < on_device {
                let pages = (on_device - row).min(SCAN_CHUNK_PAGES as u64) as usize;
                let bytes = &mut buf[..pages * PAGE_SIZE];
                let got = read_full(f, (self.header + row) * PAGE_SIZE as u64, bytes);
                for i in 0..pages {
                    let slot = (row + i as u64) * n + dev as u64;
                    if free.contains(&slot) {
                        out.free += 1;
                        continue;
                    }
                    let result = match &got {
                        Ok(got) => {
                            let page: &[u8; PAGE_SIZE] = (&bytes[i * PAGE_SIZE..][..PAGE_SIZE])
                                .try_into()
                                .expect("one page");
                            let have = got.saturating_sub(i * PAGE_SIZE).min(PAGE_SIZE);
                            classify(page, have, pid_of(slot), slot, path)
                        }
                        Err(e) => Err(StoreError::Io {
                            path: path.clone(),
                            source: std::io::Error::new(e.kind(), e.to_string()),
                        }),
                    };
                    match result {
                        Ok(()) => out.intact += 1,
                        Err(StoreError::NeverWritten { .. }) => {
                            out.never_written += 1;
                            if out.never_written_slots.len() < MAX_LISTED {
                                out.never_written_slots.push(slot);
                            }
                        }
                        Err(e) => {
                            out.corrupt += 1;
                            if out.corrupt_slots.len() < MAX_LISTED {
                                out.corrupt_slots.push((slot, e.to_string()));
                            }
                        }
                    }
                }
                row += pages as u64;
                done += pages as u64;
                progress(done);
            }
        }
        out.corrupt_slots.sort_by_key(|c| c.0);
        out.never_written_slots.sort_unstable();
        out
    }
}

/// Verify a page image of which `got` bytes were read, as the store's own reads do: a short
/// read or an all-zero page is "never written", anything else must be sealed and hold `pid`.
fn classify(
    page: &[u8; PAGE_SIZE],
    got: usize,
    pid: u64,
    slot: u64,
    path: &Path,
) -> StoreResult<()> {
    let never = || StoreError::NeverWritten {
        pid,
        slot,
        path: path.to_path_buf(),
        got,
    };
    if got < PAGE_SIZE {
        return Err(never());
    }
    verify(page, pid, slot, path).map_err(|e| {
        if page.iter().all(|&b| b == 0) {
            never()
        } else {
            e
        }
    })
}

/// Read up to `buf.len()` bytes at `offset`, retrying short reads until the end of the file.
/// Returns the number of bytes read; the rest of `buf` is zeroed.
fn read_full(f: &File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf[got..].fill(0);
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::AlignedPage;
    use crate::store::{OpenMode, PageStore, StoreConfig, WriteRequest};
    use std::io::{Seek, SeekFrom, Write};

    /// A store on `devices` files with `pages` written pages (slot s holds pid 1000 + s, data
    /// byte 0 = s), `free` of them freed again, closed cleanly.
    fn make(dir: &Path, devices: usize, pages: u64, free: &[u64]) -> Vec<PathBuf> {
        let paths: Vec<PathBuf> = (0..devices).map(|i| dir.join(format!("d{i}"))).collect();
        let mut cfg = StoreConfig::new(paths.clone());
        cfg.mode = OpenMode::Create;
        let s = PageStore::open(&cfg).unwrap();
        for _ in 0..pages {
            let slot = s.allocate().unwrap();
            let mut p = AlignedPage::new();
            p[0] = slot as u8;
            let mut reqs = [WriteRequest {
                slot,
                pid: 1000 + slot,
                page: &mut p,
            }];
            s.write_batch(&mut reqs).pop().unwrap().unwrap();
        }
        for &f in free {
            s.free(f).unwrap();
        }
        s.close().unwrap();
        paths
    }

    fn scan(r: &StoreReader) -> SlotScan {
        let free: HashSet<u64> = r.free_slots().unwrap().unwrap().into_iter().collect();
        r.scan(&free, |s| 1000 + s, |_| {})
    }

    #[test]
    fn scan_of_a_clean_store_counts_every_slot_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let paths = make(dir.path(), 3, 50, &[4, 17, 30]);
        let before: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
        let r = StoreReader::open(&paths).unwrap();
        assert!(r.superblock().clean);
        assert_eq!(r.slot_limit(), 50);
        let mut free = r.free_slots().unwrap().unwrap();
        free.sort_unstable();
        assert_eq!(free, vec![4, 17, 30]);
        let s = scan(&r);
        assert_eq!(
            (s.slots, s.free, s.intact, s.never_written, s.corrupt),
            (50, 3, 47, 0, 0)
        );
        assert_eq!(r.read(7, 1007).unwrap()[0], 7);
        assert!(matches!(
            r.read(7, 1008),
            Err(StoreError::WrongPage { found: 1007, .. })
        ));
        drop(r);
        let after: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
        assert!(before == after, "inspection changed the devices");
        // and the store still opens normally
        PageStore::open(&StoreConfig::new(paths))
            .unwrap()
            .close()
            .unwrap();
    }

    #[test]
    fn scan_finds_corrupt_and_misplaced_pages() {
        let dir = tempfile::tempdir().unwrap();
        let paths = make(dir.path(), 2, 20, &[]);
        // slot 9 is on device 1, row 4 (page 6, after two superblock copies): flip a data byte
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&paths[1])
            .unwrap();
        f.seek(SeekFrom::Start(6 * PAGE_SIZE as u64 + 100)).unwrap();
        f.write_all(&[0xAB]).unwrap();
        // slot 4 (device 0, row 2) gets slot 6's image (device 0, row 3): a misdirected write
        let d0 = std::fs::read(&paths[0]).unwrap();
        let mut f0 = std::fs::OpenOptions::new()
            .write(true)
            .open(&paths[0])
            .unwrap();
        f0.seek(SeekFrom::Start(4 * PAGE_SIZE as u64)).unwrap();
        f0.write_all(&d0[5 * PAGE_SIZE..6 * PAGE_SIZE]).unwrap();
        let r = StoreReader::open(&paths).unwrap();
        let s = scan(&r);
        assert_eq!((s.intact, s.corrupt), (18, 2));
        assert_eq!(s.corrupt_slots[0].0, 4);
        assert!(
            s.corrupt_slots[0].1.contains("holds page"),
            "{}",
            s.corrupt_slots[0].1
        );
        assert_eq!(s.corrupt_slots[1].0, 9);
        assert!(
            s.corrupt_slots[1].1.contains("checksum"),
            "{}",
            s.corrupt_slots[1].1
        );
    }

    #[test]
    fn unclean_store_is_scanned_to_the_end_of_its_devices() {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> = vec![dir.path().join("d0")];
        let s = PageStore::open(&StoreConfig::new(paths.clone())).unwrap();
        for _ in 0..5 {
            let slot = s.allocate().unwrap();
            let mut p = AlignedPage::new();
            let mut reqs = [WriteRequest {
                slot,
                pid: 1000 + slot,
                page: &mut p,
            }];
            s.write_batch(&mut reqs).pop().unwrap().unwrap();
        }
        drop(s); // no close: the superblock still says "open"
        let r = StoreReader::open(&paths).unwrap();
        assert!(!r.superblock().clean);
        assert!(r.free_slots().unwrap().is_none());
        // the devices were preallocated beyond the 5 written slots: those read as never written
        let limit = r.slot_limit();
        assert!(limit >= 5, "{limit}");
        let sc = r.scan(&HashSet::new(), |s| 1000 + s, |_| {});
        assert_eq!(sc.intact, 5);
        assert_eq!(sc.never_written, limit - 5);
        assert_eq!(sc.corrupt, 0);
    }

    #[test]
    fn a_file_that_is_not_a_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        std::fs::write(&p, vec![1u8; PAGE_SIZE]).unwrap();
        assert!(matches!(
            StoreReader::open(std::slice::from_ref(&p)),
            Err(StoreError::NotAStore { .. })
        ));
        std::fs::write(&p, b"short").unwrap();
        assert!(matches!(
            StoreReader::open(&[p]),
            Err(StoreError::NotAStore { .. })
        ));
    }
}
