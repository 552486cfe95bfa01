//! Reopen after clean shutdown, corruption detection, striping, and configuration errors.

use byteorder::{ByteOrder, LittleEndian};
use shoal_engine::{Engine, EngineConfig, EngineError, OpenMode, Pid, PAGE_SIZE};
use shoal_tests::{check_stamp, config, engine, stamp};
use std::io::{Read, Seek, SeekFrom, Write};

fn fill(e: &Engine, n: usize) -> Vec<Pid> {
    let w = e.worker();
    (0..n)
        .map(|i| {
            let mut g = w.allocate().unwrap();
            let pid = g.pid();
            stamp(&mut g.page_mut(), pid, i as u64);
            pid
        })
        .collect()
}

fn version(e: &Engine, pid: Pid) -> Result<u64, EngineError> {
    let w = e.worker();
    w.run(|w| {
        let g = w.shared(pid)?;
        Ok(check_stamp(g.data(), pid).expect("intact"))
    })
}

#[test]
fn reopen_after_clean_shutdown_restores_every_page_and_the_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path(), 256);
    let pids = fill(&e, 2000); // 8x the cache: most pages are already on disk
    e.worker().catalog_insert("first", pids[0]).unwrap();
    e.close().unwrap();
    drop(e);
    let mut cfg = config(dir.path(), 256);
    cfg.mode = OpenMode::Open;
    let e = Engine::open(cfg).unwrap();
    for (i, &pid) in pids.iter().enumerate() {
        assert_eq!(version(&e, pid).unwrap(), i as u64);
    }
    assert_eq!(e.worker().catalog_lookup("first").unwrap(), Some(pids[0]));
    // new allocations never reuse live slots
    let fresh = fill(&e, 1)[0];
    assert!(!pids.contains(&fresh));
}

#[test]
fn a_corrupted_page_is_an_error_naming_its_pid() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path(), 256);
    let pids = fill(&e, 10);
    let victim = pids[7];
    let devices = device_files(&e);
    let (dev, off) = e.store().slot_location(victim.slot());
    e.close().unwrap();
    drop(e);
    corrupt(&devices, (dev, off));

    let e = engine(dir.path(), 256);
    let err = version(&e, victim).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, EngineError::PageRead { pid, .. } if pid == victim),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("{:#x}", victim.raw())),
        "message names the pid: {msg}"
    );
    assert!(msg.contains("checksum"), "{msg}");
    // the other pages are unaffected
    assert_eq!(version(&e, pids[6]).unwrap(), 6);
    // and the bad page still fails the next time (no bad data was cached)
    assert!(version(&e, victim).is_err());
}

/// The files of `e`'s store.
fn device_files(e: &Engine) -> Vec<std::path::PathBuf> {
    let paths = e.store().device_paths();
    paths.iter().map(|p| p.to_path_buf()).collect()
}

/// Flip one byte of the page at `(device, offset)` (the engine must be closed).
fn corrupt(devices: &[std::path::PathBuf], (dev, off): (usize, u64)) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&devices[dev])
        .unwrap();
    f.seek(SeekFrom::Start(off + 100)).unwrap();
    let mut b = [0u8; 1];
    f.read_exact(&mut b).unwrap();
    f.seek(SeekFrom::Start(off + 100)).unwrap();
    f.write_all(&[b[0] ^ 0x40]).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn load_many_reads_the_missing_pages_together_and_reports_a_corrupt_one() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path(), 256);
    let pids = fill(&e, 600);
    let devices = device_files(&e);
    let victim = pids[300];
    let at = e.store().slot_location(victim.slot());
    e.close().unwrap();
    drop(e);

    let e = engine(dir.path(), 256);
    let reads = |e: &Engine| {
        let s = e.store().stats();
        let r = std::sync::atomic::Ordering::Relaxed;
        (s.reads.load(r), s.read_batches.load(r))
    };
    let w = e.worker();
    let some: Vec<Pid> = pids[..40].iter().step_by(3).copied().collect(); // 14 pages
    let (r0, b0) = reads(&e);
    w.load_many(&some).unwrap();
    // one read per missing page, all submitted together. Checked by breaking it on purpose
    // (2026-11-24): with `fault_many` reading page by page, 14 batches and this fails.
    assert_eq!(
        (reads(&e).0 - r0, reads(&e).1 - b0),
        (some.len() as u64, 1),
        "one read per missing page, in one batch"
    );
    assert!(e.stats().faults >= some.len() as u64);
    // all resident now: loading again reads nothing, and the pages hold what was written
    w.load_many(&some).unwrap();
    for &pid in &some {
        let i = pids.iter().position(|&p| p == pid).unwrap();
        assert_eq!(version(&e, pid).unwrap(), i as u64);
    }
    assert_eq!(
        reads(&e).0 - r0,
        some.len() as u64,
        "resident pages are not read again"
    );
    e.close().unwrap();
    drop((w, e));

    corrupt(&devices, at);
    let e = engine(dir.path(), 256);
    let w = e.worker();
    let batch = [pids[299], victim, pids[301]];
    match w.load_many(&batch) {
        Err(EngineError::PageRead { pid, .. }) => assert_eq!(pid, victim),
        other => panic!("a corrupt page in the batch: {other:?}"),
    }
    // the intact pages of the batch were loaded, the corrupt one was not kept
    let r1 = reads(&e);
    assert_eq!(version(&e, pids[299]).unwrap(), 299);
    assert_eq!(version(&e, pids[301]).unwrap(), 301);
    assert_eq!(reads(&e), r1);
    assert!(matches!(
        version(&e, victim),
        Err(EngineError::PageRead { .. })
    ));
    // pids that do not exist are refused before anything is read
    let beyond = Pid::new(0, e.store().high_water() + 5);
    assert!(matches!(
        w.load_many(&[pids[0], beyond]),
        Err(EngineError::NoSuchPage { pid: p }) if p == beyond
    ));
}

#[test]
fn a_store_on_three_files_stripes_across_all_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 256);
    cfg.devices = 3;
    let e = Engine::open(cfg.clone()).unwrap();
    let pids = fill(&e, 300);
    let paths = device_files(&e);
    e.close().unwrap();
    drop(e);
    assert_eq!(paths.len(), 3);
    for (d, p) in paths.iter().enumerate() {
        let data = std::fs::read(p).unwrap();
        // every slot s with s % 3 == d lives here, sealed as its pid's page (the trailer's
        // checksum covers the pid, and its tag holds the pid's low 16 bits)
        let mine: Vec<&Pid> = pids.iter().filter(|p| p.slot() % 3 == d as u64).collect();
        assert!(mine.len() >= 99, "device {d} holds {} pages", mine.len());
        for pid in mine {
            let off = (2 + pid.slot() as usize / 3) * PAGE_SIZE;
            let page: &[u8; PAGE_SIZE] = data[off..off + PAGE_SIZE].try_into().unwrap();
            let tag = LittleEndian::read_u16(&page[PAGE_SIZE - 4..]);
            assert_eq!(tag, pid.raw() as u16, "slot {} on device {d}", pid.slot());
            let sum = LittleEndian::read_u32(&page[PAGE_SIZE - 8..]);
            assert_eq!(
                sum,
                shoal_storage::checksum(page, pid.raw()),
                "slot {}",
                pid.slot()
            );
            assert!(check_stamp(&page[..PAGE_SIZE - 16], *pid).is_ok());
        }
    }
    let e = Engine::open(cfg).unwrap();
    assert_eq!(version(&e, pids[299]).unwrap(), 299);
}

#[test]
fn configuration_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    // cache too small
    let err = Engine::open(EngineConfig::new(dir.path(), 64 * 1024))
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("smaller than the minimum"),
        "{err}"
    );
    // data dir is a file
    // (in a directory of its own: a store is not made beside other files)
    let files = tempfile::tempdir().unwrap();
    let file = files.path().join("plain-file");
    std::fs::write(&file, b"hello").unwrap();
    let err = Engine::open(config(&file, 256)).err().unwrap();
    assert!(err.to_string().contains("not a directory"), "{err}");
    // missing data dir in open mode
    let mut c = config(&dir.path().join("missing"), 256);
    c.mode = OpenMode::Open;
    let err = Engine::open(c).err().unwrap();
    assert!(err.to_string().contains("does not exist"), "{err}");
    // existing dir without a store in open mode
    let mut c = config(dir.path(), 256);
    c.mode = OpenMode::Open;
    let err = Engine::open(c).err().unwrap();
    assert!(err.to_string().contains("no Shoal page store"), "{err}");
    // a data dir holding some other file as its device
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("node0-0.dat"), vec![7u8; 8192]).unwrap();
    let err = Engine::open(config(other.path(), 256)).err().unwrap();
    assert!(err.to_string().contains("no Shoal superblock"), "{err}");
    // the same store opened twice
    let e = engine(dir.path(), 256);
    let err = Engine::open(config(dir.path(), 256)).err().unwrap();
    assert!(
        err.to_string().contains("in use by another process"),
        "{err}"
    );
    drop(e);
    // node id out of range
    let mut c = config(dir.path(), 256);
    c.node_id = 70;
    assert!(Engine::open(c)
        .err()
        .unwrap()
        .to_string()
        .contains("at most 64 nodes"));
}

/// Issue 28: `close()` gives the data directory back at once (the store reopens in this
/// process while the closed engine still exists), and every page access afterwards, reads
/// too, fails with `Shutdown`.
#[test]
fn close_releases_the_lock_and_later_reads_fail() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path(), 256);
    let pids = fill(&e, 10);
    let w = e.worker();
    e.close().unwrap();
    let read = w.run(|w| w.shared(pids[0]).map(|_| ()));
    assert!(matches!(read, Err(EngineError::Shutdown)), "{read:?}");
    let optimistic = w.run(|w| w.optimistic(pids[1]).map(|_| ()));
    assert!(matches!(optimistic, Err(EngineError::Shutdown)));
    assert!(matches!(w.allocate(), Err(EngineError::Shutdown)));
    drop(w);
    let mut cfg = config(dir.path(), 256);
    cfg.mode = OpenMode::Open;
    let again = Engine::open(cfg).expect("the closed engine still holds the lock");
    assert_eq!(version(&again, pids[9]).unwrap(), 9);
    drop(e); // dropping the closed engine leaves the open one alone
    assert_eq!(version(&again, pids[3]).unwrap(), 3);
    again.close().unwrap();
}

/// Issue 28: without a log, `flush` writes back every dirty page (a second flush finds none);
/// after close it fails with `Shutdown`.
#[test]
fn flush_writes_back_every_dirty_page_while_open() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path(), 512);
    let pids = fill(&e, 300); // all fit: nothing evicted, all dirty
    let before = e.stats().store_writes;
    e.flush().unwrap();
    let written = e.stats().store_writes - before;
    assert!(written >= 300, "{written} pages written");
    let again = e.stats().store_writes;
    e.flush().unwrap();
    assert_eq!(e.stats().store_writes, again, "nothing was dirty any more");
    assert_eq!(version(&e, pids[299]).unwrap(), 299);
    e.close().unwrap();
    assert!(matches!(e.flush(), Err(EngineError::Shutdown)));
}

/// A new page is logged whole, so allocating waits for a checkpoint once the log is nearly
/// full, as a change does (before, allocations took the room a checkpoint needs: the log
/// filled up, no checkpoint could finish and the log failed after 30 s). Here 4,000 pages, two
/// and a half times the log, are allocated with a commit every 64, and every one reads back
/// after a clean close.
#[test]
fn allocating_more_pages_than_the_log_holds_waits_for_checkpoints_instead_of_filling_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 4096);
    cfg.durability = shoal_engine::Durability::Commit;
    cfg.wal_bytes = 6 << 20;
    let e = Engine::open(cfg.clone()).unwrap();
    let w = e.worker();
    let t0 = std::time::Instant::now();
    let mut pids = Vec::new();
    for i in 0..4000u64 {
        let mut g = w
            .allocate()
            .unwrap_or_else(|err| panic!("allocation {i}: {err}"));
        let pid = g.pid();
        stamp(&mut g.page_mut(), pid, i);
        drop(g);
        pids.push(pid);
        if i % 64 == 63 {
            w.commit()
                .unwrap_or_else(|err| panic!("commit after {i}: {err}"));
        }
    }
    w.commit().unwrap();
    let took = t0.elapsed();
    drop(w);
    e.close().unwrap();
    drop(e);
    cfg.mode = OpenMode::Open;
    let e = Engine::open(cfg).unwrap();
    for (i, &pid) in pids.iter().enumerate() {
        assert_eq!(version(&e, pid).unwrap(), i as u64);
    }
    eprintln!("4,000 pages allocated through a 6 MiB log in {took:?}");
}
