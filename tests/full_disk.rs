//! A full device: the error is clear, and nothing is lost. Normally the allocation that needs
//! room is refused (every slot handed out has its room reserved); where room is taken from
//! under the engine (a file system without fallocate, a thin device), write-backs fail and the
//! pages stay dirty in memory until there is room again.
//!
//! The "disk" fills up through RLIMIT_FSIZE (fallocate and writes past the limit fail with
//! EFBIG, reported as a full device). This file is its own test binary, so the process-wide
//! limit touches no other test (each test sets the limit it needs; they run one at a time
//! under a lock).

use shoal_engine::{Engine, EngineError, OpResult, Pid};
use shoal_tests::{check_stamp, config, stamp};

/// The stamp version of `pid`, read under a shared guard (the page must be intact).
fn stamped_version(w: &shoal_engine::Worker, pid: Pid) -> u64 {
    w.run(|w| -> OpResult<u64> {
        let g = w.shared(pid)?;
        Ok(check_stamp(g.data(), pid).expect("intact"))
    })
    .unwrap()
}

fn set_fsize_limit(bytes: u64) {
    let lim = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscalls with valid arguments; ignoring SIGXFSZ makes an over-limit write
    // fail with EFBIG instead of killing the process.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
    }
}

/// Allocate and stamp pages until an allocation fails: the pages and the error. A wait for a
/// free frame that ran out before the provider met the full device (a loaded machine: the
/// provider had not run yet) says so without "is full"; such errors are retried for up to a
/// minute, so the outcome does not depend on how fast the machine is.
fn allocate_until_error(w: &shoal_engine::Worker) -> (Vec<Pid>, EngineError) {
    let mut pids: Vec<Pid> = Vec::new();
    let t0 = std::time::Instant::now();
    loop {
        match w.allocate() {
            Ok(mut g) => {
                let pid = g.pid();
                stamp(&mut g.page_mut(), pid, 1);
                pids.push(pid);
            }
            Err(e @ EngineError::NoFreeFrame { .. })
                if !e.to_string().contains("is full")
                    && t0.elapsed() < std::time::Duration::from_secs(60) =>
            {
                eprintln!("retrying after: {e}");
            }
            Err(e) => return (pids, e),
        }
        assert!(pids.len() < 10_000, "allocation never failed");
    }
}

/// Close `e`, open its store again from `cfg`, and check every page of `pids`.
fn reopen_and_check(e: Engine, cfg: shoal_engine::EngineConfig, pids: &[Pid]) {
    e.close().unwrap();
    drop(e);
    let e = Engine::open(cfg).unwrap();
    let w = e.worker();
    for &pid in pids {
        assert_eq!(stamped_version(&w, pid), 1);
    }
}

/// The tests change a process-wide limit: one at a time.
static LIMIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_full_device_refuses_allocations_and_keeps_every_page() {
    let _one = LIMIT.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 256);
    let e = Engine::open(cfg.clone()).unwrap();
    // Room for the two superblock copies and 400 pages only (the first allocation reserves
    // room).
    set_fsize_limit(402 * 4096);
    let w = e.worker();
    let (mut pids, err) = allocate_until_error(&w);
    let msg = err.to_string();
    assert!(
        msg.contains("is full") && msg.contains("no room") && msg.contains("node0-0.dat"),
        "the error says which device is full: {msg}"
    );
    // slots 1..=399 (slot 0 is the catalog's): all that fit, none was refused early
    assert_eq!(pids.len(), 399, "{msg}");
    // 399 pages in a 256-frame cache: some were written back and evicted, and no write failed
    // (each page's room was reserved when it was allocated)
    assert_eq!(e.stats().write_errors, 0);
    assert!(pids.iter().any(|&p| !e.is_resident(p)));
    for &pid in &pids {
        assert_eq!(stamped_version(&w, pid), 1);
    }
    // Room comes back: allocation works again, and takes the refused slot.
    set_fsize_limit(libc::RLIM_INFINITY);
    let mut g = w.allocate().unwrap();
    let pid = g.pid();
    assert_eq!(pid.slot(), 400);
    stamp(&mut g.page_mut(), pid, 1);
    drop(g);
    pids.push(pid);
    drop(w);
    reopen_and_check(e, cfg, &pids);
}

#[test]
fn room_taken_from_under_the_engine_fails_write_backs_and_loses_nothing() {
    let _one = LIMIT.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 256);
    cfg.free_frame_timeout = std::time::Duration::from_secs(2);
    let e = Engine::open(cfg.clone()).unwrap();
    let w = e.worker();
    // Reserve the device's first chunk, then take the reserved room away again (what a file
    // system without fallocate, or a thin device, amounts to): the file ends after the
    // two superblock copies and the catalog, and may not grow past ~100 more pages.
    drop(w.allocate().unwrap());
    let device = dir.path().join("node0-0.dat");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&device)
        .unwrap()
        .set_len(3 * 4096)
        .unwrap();
    set_fsize_limit(102 * 4096);
    let (pids, err) = allocate_until_error(&w);
    let msg = err.to_string();
    assert!(matches!(err, EngineError::NoFreeFrame { .. }), "{msg}");
    assert!(
        msg.contains("is full"),
        "the error says the device is full: {msg}"
    );
    assert!(
        msg.contains("node0-0.dat"),
        "the error names the device: {msg}"
    );
    assert!(e.stats().write_errors > 0);

    // While the device is full: resident pages read fine; a page that must be read back in
    // needs a frame, every frame holds an unwritable dirty page, so the read fails with the
    // same clear reason (never with wrong data, never a hang).
    let resident: Vec<Pid> = pids.iter().copied().filter(|&p| e.is_resident(p)).collect();
    assert!(!resident.is_empty());
    for &pid in &resident {
        assert_eq!(stamped_version(&w, pid), 1);
    }
    if let Some(&gone) = pids.iter().find(|&&p| !e.is_resident(p)) {
        let err = w.run(|w| w.shared(gone).map(|_| ())).unwrap_err();
        assert!(err.to_string().contains("is full"), "{err}");
    }
    // Space comes back: the provider's retried write-backs succeed and every page is readable.
    set_fsize_limit(libc::RLIM_INFINITY);
    for &pid in &pids {
        assert_eq!(stamped_version(&w, pid), 1);
    }
    // Shutdown writes everything, and a reopen finds every page.
    drop(w);
    reopen_and_check(e, cfg, &pids);
}
