//! Buffer-manager benchmarks (issue: foundation).
//!
//! 1. Optimistic access to a resident page, single-threaded: take guard, read 8 bytes,
//!    validate. Reported in ns per access, for one hot page and for random pages of a resident
//!    set.
//! 2. Random page reads with 80% of pages not resident (data set = 5x cache), at 1, 2, 16 and
//!    32 threads, next to the raw random-read IOPS of the same file at the same queue depth
//!    measured by our own io_uring harness.
//!
//! Run: `cargo bench -p shoal-benches --bench engine` (SHOAL_BENCH_SECS, SHOAL_BENCH_DIR,
//! SHOAL_BENCH_ONLY=hit|reads).

use rand::{Rng, SeedableRng};
use shoal_benches::{bench_dir, bench_secs, raw_random_read_iops};
use shoal_engine::{Engine, OpResult, Pid, PAGE_SIZE};
use std::hint::black_box;
use std::time::Instant;

fn main() {
    let only = std::env::var("SHOAL_BENCH_ONLY").unwrap_or_default();
    if only.is_empty() || only == "hit" {
        optimistic_hit();
    }
    if only.is_empty() || only == "reads" {
        random_reads();
    }
}

fn optimistic_hit() {
    let dir = bench_dir();
    let e = Engine::open(shoal_benches::config(dir.path(), 1 << 30)).unwrap();
    let w = e.worker();
    let pids: Vec<Pid> = (0..4096)
        .map(|i| {
            let mut g = w.allocate().unwrap();
            g.page_mut().set_u64(0, i);
            g.pid()
        })
        .collect();
    let n = 20_000_000u64;
    let big: Vec<Pid> = (0..100_000)
        .map(|i| {
            let mut g = w.allocate().unwrap();
            g.page_mut().set_u64(0, i);
            g.pid()
        })
        .collect();
    for (label, set) in [
        ("one hot page", &pids[..1]),
        ("4096 resident pages", &pids[..]),
        (
            "100000 resident pages (400 MiB, beyond the CPU caches)",
            &big[..],
        ),
    ] {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let order: Vec<Pid> = (0..1 << 16)
            .map(|_| set[rng.random_range(0..set.len())])
            .collect();
        let mut sum = 0u64;
        let t = Instant::now();
        for i in 0..n {
            let pid = order[(i as usize) & 0xFFFF];
            sum = sum.wrapping_add(
                w.run(|w| -> OpResult<u64> {
                    let g = w.optimistic(pid)?;
                    let v = g.page().u64(0);
                    g.validate()?;
                    Ok(v)
                })
                .unwrap(),
            );
        }
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        black_box(sum);
        println!("optimistic hit, {label}: {ns:.1} ns/access ({n} accesses, 1 thread)");
        println!("{{\"bench\":\"optimistic_hit\",\"set\":\"{label}\",\"ns_per_access\":{ns:.2}}}");
    }
    drop(w);
    e.close().unwrap();
}

fn random_reads() {
    let dir = bench_dir();
    let cache_frames: usize = 16 * 1024; // 64 MiB
    let pages = cache_frames as u64 * 5; // 80% of pages not resident
    let secs = bench_secs(10);
    let mut cfg = shoal_benches::config(dir.path(), cache_frames * PAGE_SIZE);
    {
        let e = Engine::open(cfg.clone()).unwrap();
        let w = e.worker();
        for i in 0..pages {
            let mut g = w.allocate().unwrap();
            g.page_mut().set_u64(0, i);
        }
        drop(w);
        e.close().unwrap();
    }
    cfg.mode = shoal_engine::OpenMode::Open;
    println!(
        "\nrandom page reads: {pages} pages ({} MiB), cache {} MiB ({}% resident), {}s per point",
        (pages * 4096) >> 20,
        (cache_frames * 4096) >> 20,
        cache_frames as u64 * 100 / pages,
        secs.as_secs()
    );
    println!("threads | engine ops/s | device reads/s | hit % | raw io_uring IOPS (qd=threads) | engine/raw");
    for threads in [1usize, 2, 16, 32] {
        let e = Engine::open(cfg.clone()).unwrap();
        // warm the cache to steady state
        warm(&e, pages, cache_frames * 2);
        let before = e.stats();
        let t = Instant::now();
        let ops: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let e = &e;
                    s.spawn(move || {
                        let w = e.worker();
                        let mut rng = rand::rngs::SmallRng::seed_from_u64(t as u64 + 11);
                        let mut n = 0u64;
                        let start = Instant::now();
                        while start.elapsed() < secs {
                            for _ in 0..64 {
                                let pid = Pid::new(0, rng.random_range(1..=pages));
                                let v = w
                                    .run(|w| -> OpResult<u64> {
                                        let g = w.optimistic(pid)?;
                                        let v = g.page().u64(0);
                                        g.validate()?;
                                        Ok(v)
                                    })
                                    .unwrap();
                                assert_eq!(v, pid.slot() - 1);
                                n += 1;
                            }
                        }
                        n
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        let el = t.elapsed().as_secs_f64();
        let after = e.stats();
        let reads = after.store_reads - before.store_reads;
        let hits = (after.hits - before.hits) as f64;
        let faults = (after.faults - before.faults) as f64;
        let dev_path = e.store().device_paths()[0].to_path_buf();
        drop(e);
        let raw = raw_random_read_iops(&dev_path, pages, threads as u32, secs);
        let eng_reads = reads as f64 / el;
        println!(
            "{threads:>7} | {:>12.0} | {:>14.0} | {:>5.1} | {:>30.0} | {:>9.2}",
            ops as f64 / el,
            eng_reads,
            100.0 * (hits - faults).max(0.0) / hits.max(1.0),
            raw,
            eng_reads / raw
        );
        println!(
            "{{\"bench\":\"random_reads\",\"threads\":{threads},\"ops_per_s\":{:.0},\"device_reads_per_s\":{eng_reads:.0},\"raw_iops\":{raw:.0},\"ratio\":{:.3}}}",
            ops as f64 / el,
            eng_reads / raw
        );
    }
}

fn warm(e: &Engine, pages: u64, n: usize) {
    let w = e.worker();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(99);
    for _ in 0..n {
        let pid = Pid::new(0, rng.random_range(1..=pages));
        w.run(|w| w.optimistic(pid).map(|_| ())).unwrap();
    }
}
