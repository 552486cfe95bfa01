//! Shared pieces of Shoal's benchmarks: a raw io_uring random-read harness (the device's own
//! ceiling, measured the same way the engine is) and small timing helpers.
//!
//! Benchmarks print a table and one JSON line per measurement; results are recorded by hand in
//! docs/BENCHMARKS.md with the command, machine and date.

use rand::{Rng, SeedableRng};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Random 4 KiB O_DIRECT reads of pages `1..=pages` of `path` (page 0 is a superblock), keeping
/// `qd` requests in flight from one thread for `dur`. Returns reads per second.
pub fn raw_random_read_iops(path: &Path, pages: u64, qd: u32, dur: Duration) -> f64 {
    use io_uring::{opcode, types, IoUring};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .expect("open device");
    let fd = types::Fd(f.as_raw_fd());
    let mut ring = IoUring::new(qd.next_power_of_two().max(8)).expect("io_uring");
    let mut bufs: Vec<shoal_storage::AlignedPage> =
        (0..qd).map(|_| shoal_storage::AlignedPage::new()).collect();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let mut submit = |ring: &mut IoUring, i: usize, bufs: &mut [shoal_storage::AlignedPage]| {
        let page = rng.random_range(1..=pages);
        let e = opcode::Read::new(fd, bufs[i].as_mut_ptr(), 4096)
            .offset(page * 4096)
            .build()
            .user_data(i as u64);
        // SAFETY: bufs[i] outlives the request: we reap every completion before returning.
        unsafe { ring.submission().push(&e).expect("sq has room") };
    };
    for i in 0..qd as usize {
        submit(&mut ring, i, &mut bufs);
    }
    let start = Instant::now();
    let mut done = 0u64;
    let mut inflight = qd as usize;
    let mut stopping = false;
    while inflight > 0 {
        ring.submit_and_wait(1).expect("submit");
        let ids: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (i, res) in ids {
            assert_eq!(res, 4096, "raw read failed: {res}");
            done += 1;
            inflight -= 1;
            if !stopping && start.elapsed() >= dur {
                stopping = true;
            }
            if !stopping {
                submit(&mut ring, i, &mut bufs);
                inflight += 1;
            }
        }
    }
    done as f64 / start.elapsed().as_secs_f64()
}

/// Seconds to run each measurement: `SHOAL_BENCH_SECS` or `default`.
pub fn bench_secs(default: u64) -> Duration {
    Duration::from_secs(
        std::env::var("SHOAL_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default),
    )
}

/// An engine configuration for a benchmark: `cache` bytes in `dir`, without a log
/// (durability none): the benchmarks measure pages, trees and messages, not the log, unless
/// they say otherwise.
pub fn config(dir: &Path, cache: usize) -> shoal_engine::EngineConfig {
    let mut c = shoal_engine::EngineConfig::new(dir, cache);
    c.durability = shoal_engine::Durability::None;
    c
}

/// Where benchmark data lives: `SHOAL_BENCH_DIR` (should be on the NVMe device under test) or
/// a temporary directory under the current directory.
pub fn bench_dir() -> tempfile::TempDir {
    match std::env::var("SHOAL_BENCH_DIR") {
        Ok(d) => tempfile::tempdir_in(d).expect("SHOAL_BENCH_DIR is writable"),
        Err(_) => tempfile::tempdir_in(".").expect("current directory is writable"),
    }
}

/// A cluster of `n` `tcp` transports on loopback in this process (each node's region made by
/// `region()`), connected to each other; `encrypt`: sealed frames (with a fixed secret).
/// Panics on failure (benchmark set-up).
pub fn loopback_tcp(
    n: usize,
    region: impl Fn() -> shoal_messaging::Region,
    encrypt: bool,
) -> Vec<std::sync::Arc<shoal_messaging::TcpTransport>> {
    use shoal_messaging::{TcpConfig, TcpTransport};
    let ls: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback"))
        .collect();
    let addrs: Vec<_> = ls
        .iter()
        .map(|l| l.local_addr().expect("address"))
        .collect();
    let hs: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let mut cfg = TcpConfig::new(i as u8, 7, addrs.clone());
            cfg.connect_timeout = Duration::from_secs(10);
            if encrypt {
                cfg.secret = b"a benchmark's cluster secret....".to_vec();
                cfg.encrypt = true;
            }
            let r = std::sync::Arc::new(region());
            std::thread::spawn(move || TcpTransport::start(cfg, l, r).expect("tcp transport"))
        })
        .collect();
    hs.into_iter().map(|h| h.join().expect("connect")).collect()
}
