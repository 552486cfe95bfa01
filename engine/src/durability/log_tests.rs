//! The log with the store under it: a damaged log is refused (never read as a short one), a
//! torn last flush is its end, a log of another store or a missing log is named, a data file
//! cut short is refused, an interrupted creation leaves no store or a whole one, a page
//! whose write-back was torn by a crash is repaired from the log at open, a flush that stops
//! at a chunk being finished is not taken for a full log, a log with an older build's
//! cut-off transaction is refused with nothing written, and a full log waits before the block
//! that holds its keep point.
//!
//! Each test writes page images through the log (one flush per page, so the log holds many
//! flushes), "crashes" by dropping the store without closing it, changes the files as the
//! fault would, and opens the store again.

use super::logged;
use shoal_storage::wal::{put_diff, put_image, put_undo};
use shoal_storage::WriteRequest;
use shoal_storage::{
    AlignedPage, PageStore, StoreConfig, StoreError, WalConfig, PAGE_DATA_SIZE, PAGE_SIZE,
};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// Pages each test writes.
const PAGES: u64 = 120;

fn config(dir: &Path) -> StoreConfig {
    let dev = dir.join("node0-0.dat");
    let mut c = StoreConfig::new(vec![dev.clone()]);
    let mut w = WalConfig::new(shoal_storage::default_log_path(&dev));
    w.file_bytes = 4 << 20;
    w.ring_bytes = 256 << 10;
    c.wal = Some(w);
    c
}

/// The error opening `c` gives (it must fail).
fn refused(c: &StoreConfig) -> StoreError {
    PageStore::open(c).err().expect("the store was opened")
}

/// `c` opened with durability none (and `allow_unclean`).
fn without_log(c: &StoreConfig) -> StoreConfig {
    let mut none = c.clone();
    none.wal = None;
    none.allow_unclean = true;
    none
}

fn log_path(c: &StoreConfig) -> PathBuf {
    c.wal.as_ref().unwrap().path.clone()
}

/// The content of page `i`.
fn page_of(i: u64) -> Vec<u8> {
    (0..PAGE_DATA_SIZE)
        .map(|b| (b as u64 * 7 + i * 13) as u8)
        .collect()
}

/// Write `PAGES` pages through the log, one flush each, and crash (drop without close).
/// Returns the slots and, per page, the log's physical bytes written after its flush.
fn crashed_store(c: &StoreConfig) -> (Vec<u64>, Vec<u64>) {
    crashed_store_with(c, |_| {})
}

/// As [`crashed_store`], calling `before_last` just before the last page is logged.
fn crashed_store_with(c: &StoreConfig, before_last: impl FnMut(u64)) -> (Vec<u64>, Vec<u64>) {
    crashed_store_at(c, PAGES - 1, before_last)
}

/// As [`crashed_store`], calling `before(i)` just before page `i` is logged.
fn crashed_store_at(c: &StoreConfig, at: u64, mut before: impl FnMut(u64)) -> (Vec<u64>, Vec<u64>) {
    let (store, log) = logged(c);
    let w = log.log();
    let mut slots = Vec::new();
    let mut written = Vec::new();
    let mut buf = Vec::new();
    for i in 0..PAGES {
        if i == at {
            before(i);
        }
        let slot = store.allocate().unwrap();
        let (_, end) = w
            .append(&mut buf, |_, b| {
                put_image(b, slot, 1000 + slot, 1, &page_of(i))
            })
            .unwrap();
        w.flush_to(end).unwrap();
        slots.push(slot);
        written.push(w.stats.snapshot().bytes_written);
    }
    (slots, written)
}

fn read(store: &PageStore, slot: u64) -> Result<Vec<u8>, StoreError> {
    let mut buf = AlignedPage::new();
    // SAFETY: `buf` is an exclusively owned aligned page.
    unsafe { store.read_into(slot, 1000 + slot, buf.as_mut_ptr())? };
    Ok(buf[..PAGE_DATA_SIZE].to_vec())
}

/// File offset of the log's data area.
const DATA: u64 = 2 * 4096;

fn damage(path: &Path, at: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, at).unwrap();
}

fn flip(path: &Path, at: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x10], at).unwrap();
}

/// A byte of chunk data (not a sector's stamp) near `at` in the data area.
fn data_byte(at: u64) -> u64 {
    let off = at - DATA;
    DATA + off / 512 * 512 + 100
}

#[test]
fn a_bit_flipped_in_the_middle_of_the_log_is_refused_with_its_range_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (slots, written) = crashed_store(&c);
    let log = log_path(&c);
    let middle = written[PAGES as usize / 2];
    flip(&log, data_byte(DATA + middle));
    let before_log = std::fs::read(&log).unwrap();
    let before_dev = std::fs::read(&c.devices[0]).unwrap();

    let e = PageStore::open(&c).err().expect("a damaged log is refused");
    let StoreError::LogDamaged {
        lsn,
        resumes_at,
        pages,
        ..
    } = &e
    else {
        panic!("expected LogDamaged, got {e}");
    };
    let text = e.to_string();
    assert!(text.contains(&format!("LSN {lsn}")), "{text}");
    assert!(
        resumes_at.is_some_and(|r| r > *lsn),
        "the next intact chunk is named: {text}"
    );
    assert_eq!(pages.len(), 1, "the damaged chunk's page is named: {text}");
    assert!(text.contains("--discard-damaged-log"), "{text}");
    assert_eq!(
        std::fs::read(&log).unwrap(),
        before_log,
        "the log is untouched"
    );
    assert_eq!(
        std::fs::read(&c.devices[0]).unwrap(),
        before_dev,
        "the store is untouched"
    );
    // inspect sees the same damage
    let info = shoal_storage::wal::survey(&log, shoal_storage::wal::ScanMode::Judge).unwrap();
    assert!(info.damage.is_some(), "{info:?}");

    // asked to, recovery keeps what precedes the damage and gives up the rest
    let mut discard = c.clone();
    discard.discard_damaged_log = true;
    let store = PageStore::open(&discard).unwrap();
    let r = store.replayed().unwrap();
    assert!(
        matches!(r.end, Some(shoal_storage::wal::LogEnd::Discarded { .. })),
        "{r:?}"
    );
    let kept = slots
        .iter()
        .take_while(|&&s| read(&store, s).is_ok())
        .count();
    assert!(
        (PAGES as usize / 2 - 2..=PAGES as usize / 2 + 1).contains(&kept),
        "pages up to the damage come back: {kept}"
    );
    for (i, &s) in slots.iter().take(kept).enumerate() {
        assert_eq!(read(&store, s).unwrap(), page_of(i as u64));
    }
    store.close().unwrap();
}

#[test]
fn zeros_over_part_of_the_log_are_damage_not_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (_, written) = crashed_store(&c);
    let log = log_path(&c);
    // 64 KiB of zeros at 30% of what was written
    let at = DATA + written[PAGES as usize * 3 / 10] / 4096 * 4096;
    damage(&log, at, &vec![0u8; 64 << 10]);
    let e = refused(&c);
    assert!(matches!(e, StoreError::LogDamaged { .. }), "{e}");
    assert!(e.to_string().contains("erased"), "{e}");
}

#[test]
fn zeros_over_the_newest_flush_are_damage_too() {
    // a power loss leaves a sector as it was before (a log stamps every sector when it is
    // made); zeros in the last flush are erasure, not a torn write
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (_, written) = crashed_store(&c);
    let log = log_path(&c);
    let (from, to) = (written[PAGES as usize - 2], written[PAGES as usize - 1]);
    assert!(to - from > 1024, "the last flush spans sectors");
    damage(&log, data_byte(DATA + from + 512) / 512 * 512, &[0u8; 512]);
    let e = refused(&c);
    assert!(matches!(e, StoreError::LogDamaged { .. }), "{e}");
}

#[test]
fn a_torn_last_flush_ends_the_log_and_only_it_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let log = log_path(&c);
    let mut old = Vec::new();
    let (slots, written) = crashed_store_with(&c, |_| old = std::fs::read(&log).unwrap());
    // the last flush reached the device only in part: every other sector of it kept the bytes
    // it held before
    let (from, to) = (written[PAGES as usize - 2], written[PAGES as usize - 1]);
    let mut s = from;
    while s < to {
        if (s / 512) % 2 == 1 {
            let at = (DATA + s) as usize;
            damage(&log, at as u64, &old[at..at + 512]);
        }
        s += 512;
    }
    let store = PageStore::open(&c).expect("a torn tail is the log's end");
    let r = store.replayed().unwrap();
    assert!(
        matches!(r.end, Some(shoal_storage::wal::LogEnd::TornTail { .. })),
        "{r:?}"
    );
    for (i, &s) in slots.iter().enumerate().take(PAGES as usize - 1) {
        assert_eq!(read(&store, s).unwrap(), page_of(i as u64), "page {i}");
    }
    assert!(read(&store, slots[PAGES as usize - 1]).is_err());
    store.close().unwrap();
}

#[test]
fn a_log_from_another_store_is_refused() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ca, cb) = (config(a.path()), config(b.path()));
    crashed_store(&ca);
    crashed_store(&cb);
    for suffix in ["", ".alloc0", ".alloc1"] {
        let name = |c: &StoreConfig| {
            let mut s = log_path(c).into_os_string();
            s.push(suffix);
            PathBuf::from(s)
        };
        std::fs::copy(name(&ca), name(&cb)).unwrap();
    }
    let e = refused(&cb);
    assert!(matches!(e, StoreError::ForeignLog { .. }), "{e}");
}

#[test]
fn a_missing_log_is_named_not_taken_for_a_store_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    crashed_store(&c);
    std::fs::remove_file(log_path(&c)).unwrap();
    let e = refused(&c);
    assert!(matches!(e, StoreError::LogMissing { .. }), "{e}");
    let e = refused(&without_log(&c));
    assert!(matches!(e, StoreError::LogMissing { .. }), "{e}");
}

#[test]
fn a_store_that_needs_its_log_is_not_opened_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    crashed_store(&c);
    let e = refused(&without_log(&c));
    assert!(matches!(e, StoreError::NeedsRecovery { .. }), "{e}");
    assert!(log_path(&c).exists(), "the log was not deleted");
}

#[test]
fn a_data_file_cut_short_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (slots, _) = crashed_store(&c);
    // a clean store first, then cut its file to half of what its slots need
    let store = PageStore::open(&c).unwrap();
    store.close().unwrap();
    drop(store);
    let need = (2 + slots.len() as u64) * PAGE_SIZE as u64;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&c.devices[0])
        .unwrap();
    f.set_len(need / 2).unwrap();
    let e = refused(&c);
    assert!(matches!(e, StoreError::Truncated { .. }), "{e}");
    // and on a crashed store whose pages were written back before its last checkpoint
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (store, log) = logged(&c);
    let mut pages: Vec<(u64, AlignedPage)> = (0..PAGES)
        .map(|i| {
            let mut p = AlignedPage::new();
            p[..PAGE_DATA_SIZE].copy_from_slice(&page_of(i));
            (store.allocate().unwrap(), p)
        })
        .collect();
    let mut reqs: Vec<shoal_storage::WriteRequest<'_>> = pages
        .iter_mut()
        .map(|(slot, page)| shoal_storage::WriteRequest {
            slot: *slot,
            pid: 1000 + *slot,
            page,
        })
        .collect();
    assert!(store.write_batch(&mut reqs).iter().all(|r| r.is_ok()));
    let cp = log.begin_checkpoint().unwrap();
    log.finish_checkpoint(&store, cp, true).unwrap();
    drop(reqs);
    drop(store); // crash
    let need = (2 + PAGES) * PAGE_SIZE as u64;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&c.devices[0])
        .unwrap();
    f.set_len(need / 2).unwrap();
    let e = refused(&c);
    assert!(matches!(e, StoreError::Truncated { .. }), "{e}");
}

#[test]
fn leftovers_of_an_interrupted_creation_are_replaced_or_finished() {
    // before the commit point: only temporary files; a new store is made over them
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let tmp = |p: &Path| shoal_storage::with_suffix(p, shoal_storage::CREATING);
    std::fs::write(tmp(&c.devices[0]), b"half a superblock").unwrap();
    std::fs::write(tmp(&log_path(&c)), b"").unwrap();
    let store = PageStore::open(&c).unwrap();
    store.close().unwrap();
    drop(store);
    assert!(!tmp(&c.devices[0]).exists() && !tmp(&log_path(&c)).exists());

    // after it: device 0 in place, the log still under its temporary name
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    PageStore::open(&c).unwrap().close().unwrap();
    let log = log_path(&c);
    std::fs::rename(&log, tmp(&log)).unwrap();
    let store = PageStore::open(&c).expect("the creation is finished at open");
    assert!(log.exists());
    store.close().unwrap();
}

#[test]
fn a_flush_lost_in_the_middle_of_the_log_is_damage_because_later_flushes_follow() {
    // a device that acknowledged a flush and then lost it leaves its place as it was before,
    // which is what a torn write leaves too; the flushes written after it tell them apart
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let log = log_path(&c);
    let mut old = Vec::new();
    let mid = PAGES / 2;
    let (_, written) = crashed_store_at(&c, mid, |_| old = std::fs::read(&log).unwrap());
    let (from, to) = (written[mid as usize - 1], written[mid as usize]);
    let (a, b) = ((DATA + from) as usize, (DATA + to) as usize);
    damage(&log, a as u64, &old[a..b]);
    let e = refused(&c);
    assert!(matches!(e, StoreError::LogDamaged { .. }), "{e}");
    assert!(e.to_string().contains("further on"), "{e}");
}

fn read_page(store: &PageStore, slot: u64) -> Result<Vec<u8>, shoal_storage::StoreError> {
    let mut buf = AlignedPage::new();
    // SAFETY: `buf` is an exclusively owned aligned page.
    unsafe { store.read_into(slot, slot, buf.as_mut_ptr())? };
    Ok(buf[..PAGE_DATA_SIZE].to_vec())
}

#[test]
fn a_torn_page_write_is_repaired_from_the_log_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut page = vec![0u8; PAGE_DATA_SIZE];
    let slot;
    {
        let (store, log) = logged(&cfg);
        slot = store.allocate().unwrap();
        // the page's first change since the checkpoint goes in whole, the next as a diff
        page.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i % 251) as u8);
        let w = log.log();
        let mut buf = Vec::new();
        w.append(&mut buf, |_, b| put_image(b, slot, slot, 1, &page))
            .unwrap();
        page[100..108].copy_from_slice(b"changed!");
        let (_, end) = w
            .append(&mut buf, |_, b| {
                put_diff(b, slot, slot, 2, [(100u16, 8u16)].into_iter(), &page)
            })
            .unwrap();
        w.flush_to(end).unwrap();
        // the write-back of the new image is torn: only its first half reaches the device
        let mut img = AlignedPage::new();
        img[..PAGE_DATA_SIZE].copy_from_slice(&page);
        store
            .write_batch(&mut [WriteRequest {
                slot,
                pid: slot,
                page: &mut img,
            }])
            .pop()
            .unwrap()
            .unwrap();
        store.sync().unwrap();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("node0-0.dat"))
            .unwrap();
        let (dev, off) = store.slot_location(slot);
        assert_eq!(dev, 0);
        f.write_all_at(&[0xAA; 2048], off + 2048).unwrap();
        assert!(
            read_page(&store, slot).is_err(),
            "the torn page fails its checksum"
        );
        // crash: dropped without close, the store stays unclean
    }
    let (store, _log) = logged(&cfg);
    let r = store.replayed().expect("the store was recovered");
    assert_eq!(r.pages, 1, "{r:?}");
    assert!(r.records >= 3, "image, diff and the allocation: {r:?}");
    assert_eq!(
        read_page(&store, slot).unwrap(),
        page,
        "repaired with the diff applied"
    );
    assert!(
        store.allocate().unwrap() != slot,
        "the slot stays allocated after recovery"
    );
    store.close().unwrap();
}

#[test]
fn a_chunk_finished_while_a_flush_stops_is_not_taken_for_a_full_log() {
    // A writer has reserved a chunk and not yet marked it complete when a flush copies the
    // log out: the flush stops there, and the writer finishes at exactly that moment. The
    // flush must see nothing to write, not a full log (which waited 30 s for a checkpoint no
    // one needed, then failed the log for good).
    use std::sync::mpsc::channel;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let (store, log) = logged(&config(dir.path()));
    let slot = store.allocate().unwrap();
    let w = log.log();
    let (reserved_tx, reserved) = channel::<()>();
    let (go_tx, go) = channel::<()>();
    let (marked_tx, marked) = channel::<()>();
    // the appender, once: stops before its mark, says so, waits for "go"
    let once = Mutex::new(Some((reserved_tx, go)));
    w.pauses.lock().before_mark = Some(Arc::new(move || {
        if let Some((reserved, go)) = once.lock().unwrap().take() {
            reserved.send(()).unwrap();
            go.recv().unwrap();
        }
    }));
    let page = page_of(1);
    w.flush_all().unwrap(); // the flush below starts at the appender's chunk
    std::thread::scope(|s| {
        let appender = s.spawn(|| {
            let mut buf = Vec::new();
            let at = w
                .append(&mut buf, |_, b| put_image(b, slot, slot, 1, &page))
                .unwrap();
            marked_tx.send(()).unwrap();
            at
        });
        reserved.recv().unwrap();
        // the flush, once: where it stopped, lets the appender finish and waits until it has
        let once = Mutex::new(Some((go_tx, marked)));
        w.pauses.lock().copy_stopped = Some(Arc::new(move || {
            if let Some((go, marked)) = once.lock().unwrap().take() {
                go.send(()).unwrap();
                marked.recv().unwrap();
            }
        }));
        let t0 = Instant::now();
        w.flush_some().unwrap();
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the flush waited {:?}",
            t0.elapsed()
        );
        assert_eq!(
            w.stats.full_waits.load(Ordering::Relaxed),
            0,
            "a wait for room"
        );
        let (_, end) = appender.join().unwrap();
        w.flush_to(end).unwrap();
        assert!(w.durable() >= end);
    });
    *w.pauses.lock() = Default::default();
}

/// Every file in `dir` with its bytes.
fn files(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

#[test]
fn a_log_holding_an_older_builds_unfinished_transaction_is_refused_and_left_as_it_was() {
    // An older build logged a transaction's changes with undo records and rolled it back at
    // recovery when a crash cut it off. This build cannot: it must refuse before writing
    // anything, or the undo records become unreachable and the half transaction stays.
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    {
        let (store, log) = logged(&cfg);
        let slot = store.allocate().unwrap();
        let w = log.log();
        let mut buf = Vec::new();
        // the transaction's first change (txn 0: it begins in this chunk), and no end
        let (_, end) = w
            .append(&mut buf, |_, b| {
                put_image(b, slot, slot, 1, &page_of(1));
                put_undo(b, 0, b"the value before");
            })
            .unwrap();
        w.flush_to(end).unwrap();
        drop(store); // crash
    }
    let before = files(dir.path());
    for _ in 0..2 {
        let e = refused(&cfg);
        assert!(
            matches!(e, StoreError::OldTransactions { count: 1, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("older build"), "{e}");
        assert!(
            files(dir.path()) == before,
            "the refused open changed the files"
        );
    }
}

#[test]
fn a_full_log_waits_before_the_block_of_an_unaligned_keep_point_and_keeps_it_readable() {
    // A flush writes whole blocks. When the keep point (a checkpoint's record) lies inside a
    // block, the block's other bytes are free to overwrite, but the flush that reaches that
    // block on the next lap must wait: writing it would overwrite the checkpoint's record.
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.wal.as_mut().unwrap().file_bytes = 1 << 20;
    let (store, log) = logged(&c);
    let w = log.log();
    let slot = store.allocate().unwrap();
    let mut page = page_of(1);
    let mut version: u64 = 1;
    // the next version of the page, changed in its first 8 bytes, logged as a small chunk
    let mut change = |page: &mut Vec<u8>| {
        version += 1;
        page[..8].copy_from_slice(&version.to_le_bytes());
        let mut buf = Vec::new();
        let ranges = [(0u16, 8u16)].into_iter();
        let at = w.append(&mut buf, |_, b| {
            put_diff(b, slot, 1000 + slot, version, ranges.clone(), page)
        });
        (version, at.unwrap().1)
    };
    let mut buf = Vec::new();
    w.append(&mut buf, |_, b| put_image(b, slot, 1000 + slot, 1, &page))
        .unwrap();
    // small chunks before the checkpoint, in its flush: its record starts inside a block
    for _ in 0..10 {
        change(&mut page);
    }
    let first = log.begin_checkpoint().unwrap();
    log.finish_checkpoint(&store, first, true).unwrap();
    // fifty blocks on, a second checkpoint, written and not yet finished: the keep point
    // stays at the first
    let mut v = 0;
    for _ in 0..50 {
        let (at, end) = change(&mut page);
        w.flush_to(end).unwrap();
        v = at;
    }
    let second = log.begin_checkpoint().unwrap();
    let (_, end) = w
        .append(&mut buf, |_, b| put_image(b, slot, 1000 + slot, v, &page))
        .unwrap();
    w.flush_to(end).unwrap();
    // one small chunk per flush, one block each: nearly a lap of the log, which passes the
    // first keep point's block and not the second's (fifty blocks on)
    let lap = w.capacity_bytes() / shoal_storage::wal::SBLOCK - 10;
    let page = std::thread::scope(|s| {
        let filler = s.spawn(|| {
            for _ in 0..lap {
                let (_, end) = change(&mut page);
                w.flush_to(end).unwrap();
            }
            page
        });
        let t0 = Instant::now();
        while w.stats.full_waits.load(Ordering::Relaxed) == 0 {
            assert!(!filler.is_finished(), "the filler ended without waiting");
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "hang: the log never filled"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(w.used_bytes() <= w.capacity_bytes());
        // (the log's own finish: the node's would first flush the tail, which waits too)
        let (alloc, _) = store.allocator_snapshot(|| w.tail());
        w.finish_checkpoint(second, &alloc).unwrap();
        filler.join().unwrap()
    });
    drop(log);
    drop(store); // crash: the open replays from the second checkpoint's record
    let (store, _log) = logged(&c);
    assert_eq!(read(&store, slot).unwrap(), page);
}

/// What [`shoal_storage::wal::carried::page_records_before`] read: (pid, version, image).
fn described(recs: &[(u8, Vec<u8>)]) -> Vec<(u64, u64, bool)> {
    recs.iter()
        .map(|(kind, body)| {
            let r = shoal_storage::wal::record::page_record(*kind, body).expect("a page record");
            let image = matches!(r.change, shoal_storage::wal::record::Change::Image(_));
            (r.pid, r.version, image)
        })
        .collect()
}

/// A checkpoint past a dead peer (engine/src/coherence/logged.rs, `carry_for_dead`) carries
/// the records of the pages it was handed, read back from the running log: exactly those
/// between the redo point and the checkpoint, and the carried file keeps a page's records
/// from its newest image on.
#[test]
fn the_records_carried_past_a_dead_peer_are_the_asked_pages_between_redo_point_and_checkpoint() {
    use shoal_storage::wal::carried::{append_carried, page_records_before, read_carried};
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (store, log) = logged(&c);
    let w = log.log();
    let path = log_path(&c);
    let (a, b, cc) = (
        store.allocate().unwrap(),
        store.allocate().unwrap(),
        store.allocate().unwrap(),
    );
    let mut buf = Vec::new();
    let mut put = |slot: u64, version: u64, image: bool| {
        let page = page_of(version);
        let (_, end) = w
            .append(&mut buf, |_, out| {
                if image {
                    put_image(out, slot, 1000 + slot, version, &page)
                } else {
                    put_diff(
                        out,
                        slot,
                        1000 + slot,
                        version,
                        [(8u16, 16u16)].into_iter(),
                        &page,
                    )
                }
            })
            .unwrap();
        w.flush_to(end).unwrap();
    };
    // before the first checkpoint: behind the redo point once it finishes
    put(a, 1, true);
    put(a, 2, false);
    put(b, 1, true);
    let first = log.begin_checkpoint().unwrap();
    log.finish_checkpoint(&store, first, true).unwrap();
    put(a, 3, false);
    put(b, 2, false);
    put(cc, 1, true);
    put(a, 4, false);
    let second = log.begin_checkpoint().unwrap();
    put(a, 5, false); // after the checkpoint: stays in the log
    let asked = |pid: u64| pid == 1000 + a || pid == 1000 + cc;
    let recs = page_records_before(&path, second, asked).unwrap();
    assert_eq!(
        described(&recs),
        vec![
            (1000 + a, 3, false),
            (1000 + cc, 1, true),
            (1000 + a, 4, false)
        ]
    );
    assert_eq!(append_carried(&path, recs).unwrap(), 3);
    // a later checkpoint carries a newer image of `a`: its older records go
    let mut img = Vec::new();
    put_image(&mut img, a, 1000 + a, 6, &page_of(6));
    let mut diff = Vec::new();
    put_diff(
        &mut diff,
        a,
        1000 + a,
        7,
        [(0u16, 8u16)].into_iter(),
        &page_of(7),
    );
    let later = vec![(img[0], img[1..].to_vec()), (diff[0], diff[1..].to_vec())];
    assert_eq!(append_carried(&path, later).unwrap(), 3);
    assert_eq!(
        described(&read_carried(&path).unwrap()),
        vec![
            (1000 + cc, 1, true),
            (1000 + a, 6, true),
            (1000 + a, 7, false)
        ]
    );
    // asked for more than the log holds: an error, never fewer records
    let e = page_records_before(&path, second + (1 << 20), asked).unwrap_err();
    assert!(e.to_string().contains("before LSN"), "{e}");
}
