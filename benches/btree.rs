//! B-tree benchmarks (issue: B-link tree): lookups of 8-byte keys with 128-byte values, uniform
//! random, and insert throughput, without any workload-driver overhead (no value checks, no
//! latency recording).
//!
//! Run: `cargo bench -p shoal-benches --bench btree` with SHOAL_BTREE_RECORDS (default 2M),
//! SHOAL_BTREE_THREADS (default 2), SHOAL_BTREE_CACHE (default 4GiB), SHOAL_BENCH_SECS.

use rand::{Rng, SeedableRng};
use shoal_benches::{bench_dir, bench_secs};
use shoal_btree::{u64_key, BTree};
use shoal_engine::{parse_bytes, Engine, EngineConfig};
use std::time::Instant;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|s| parse_bytes(&s).expect("a number or size"))
        .unwrap_or(default)
}

fn main() {
    let records = env("SHOAL_BTREE_RECORDS", 2_000_000);
    let threads = env("SHOAL_BTREE_THREADS", 2) as usize;
    let cache = env("SHOAL_BTREE_CACHE", 4 << 30) as usize;
    let secs = bench_secs(10);
    let dir = bench_dir();
    let e = Engine::open(EngineConfig::new(dir.path(), cache)).unwrap();
    let t = BTree::create(&e.worker(), "bench").unwrap();

    let t0 = Instant::now();
    std::thread::scope(|s| {
        for th in 0..threads as u64 {
            let (e, t) = (&e, &t);
            s.spawn(move || {
                let w = e.worker();
                let v = [7u8; 128];
                let (lo, hi) = (
                    records * th / threads as u64,
                    records * (th + 1) / threads as u64,
                );
                for k in lo..hi {
                    t.insert(&w, &u64_key(k), &v).unwrap();
                }
            });
        }
    });
    let ins = records as f64 / t0.elapsed().as_secs_f64();
    println!("insert (ascending, {threads} threads, adjacent ranges): {ins:.0} inserts/s");

    let t0 = Instant::now();
    let ops: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|th| {
                let (e, t) = (&e, &t);
                s.spawn(move || {
                    let w = e.worker();
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(th as u64);
                    let mut buf = Vec::with_capacity(128);
                    let mut n = 0u64;
                    while t0.elapsed() < secs {
                        for _ in 0..1024 {
                            let k = rng.random_range(0..records);
                            assert!(t.lookup(&w, &u64_key(k), &mut buf).unwrap());
                            n += 1;
                        }
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let lps = ops as f64 / t0.elapsed().as_secs_f64();
    let st = e.stats();
    println!(
        "lookup (uniform, {records} records, {threads} threads, cache {} MiB): {lps:.0} lookups/s ({} page faults)",
        cache >> 20,
        st.faults
    );
    println!("{{\"bench\":\"btree\",\"records\":{records},\"threads\":{threads},\"inserts_per_s\":{ins:.0},\"lookups_per_s\":{lps:.0}}}");
    drop(e);
}
