//! B-tree benchmarks (issue: B-link tree): lookups of 8-byte keys with 128-byte values, uniform
//! random, and insert and remove throughput, without any workload-driver overhead (no value checks, no
//! latency recording).
//!
//! Run: `cargo bench -p shoal-benches --bench btree` with SHOAL_BTREE_RECORDS (default 2M),
//! SHOAL_BTREE_THREADS (default 2), SHOAL_BTREE_CACHE (default 4GiB),
//! SHOAL_BTREE_BATCH (keys per `lookup_many` call, default 64), SHOAL_BENCH_SECS.

use rand::{Rng, SeedableRng};
use shoal_benches::{bench_dir, bench_secs};
use shoal_btree::{u64_key, BTree};
use shoal_engine::{parse_bytes, Engine, Worker};
use std::time::Instant;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|s| parse_bytes(&s).expect("a number or size"))
        .unwrap_or(default)
}

/// Run `work(thread, deadline)` on `threads` threads for `secs`; returns operations per second
/// (each thread returns how many it did).
fn timed(
    threads: usize,
    secs: std::time::Duration,
    work: impl Fn(usize, Instant) -> u64 + Sync,
) -> f64 {
    let t0 = Instant::now();
    let deadline = t0 + secs;
    let ops: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|th| {
                let work = &work;
                s.spawn(move || work(th, deadline))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    ops as f64 / t0.elapsed().as_secs_f64()
}

/// `op(worker, k)` for every key `0..records`, ascending, split into `threads` adjacent ranges
/// with one thread each (as `shoal ycsb` loads).
fn each_key_in_ranges(e: &Engine, threads: usize, records: u64, op: impl Fn(&Worker, u64) + Sync) {
    std::thread::scope(|s| {
        for th in 0..threads as u64 {
            let op = &op;
            s.spawn(move || {
                let w = e.worker();
                let n = threads as u64;
                for k in records * th / n..records * (th + 1) / n {
                    op(&w, k);
                }
            });
        }
    });
}

fn main() {
    let records = env("SHOAL_BTREE_RECORDS", 2_000_000);
    let threads = env("SHOAL_BTREE_THREADS", 2) as usize;
    let cache = env("SHOAL_BTREE_CACHE", 4 << 30) as usize;
    let secs = bench_secs(10);
    let dir = bench_dir();
    let e = Engine::open(shoal_benches::config(dir.path(), cache)).unwrap();
    let t = BTree::create(&e.worker(), "bench").unwrap();

    let t0 = Instant::now();
    each_key_in_ranges(&e, threads, records, |w, k| {
        assert!(t.insert(w, u64_key(k), [7u8; 128]).unwrap().inserted());
    });
    let ins = records as f64 / t0.elapsed().as_secs_f64();
    println!("insert (ascending, {threads} threads, adjacent ranges): {ins:.0} inserts/s");

    // One key at a time (`lookup`), then in batches (`lookup_many`, a multi-get).
    let lps = timed(threads, secs, |th, deadline| {
        let w = e.worker();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(th as u64);
        let mut buf = Vec::with_capacity(128);
        let mut n = 0u64;
        while Instant::now() < deadline {
            for _ in 0..1024 {
                let k = rng.random_range(0..records);
                assert!(t.lookup(&w, u64_key(k), &mut buf).unwrap());
                n += 1;
            }
        }
        n
    });
    let faults = e.stats().faults;
    println!(
        "lookup (uniform, {records} records, {threads} threads, cache {} MiB): {lps:.0} lookups/s ({faults} page faults)",
        cache >> 20,
    );
    let batch = env("SHOAL_BTREE_BATCH", 64).max(1) as usize;
    let bps = timed(threads, secs, |th, deadline| {
        let w = e.worker();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1000 + th as u64);
        let mut keys = vec![[0u8; 8]; batch];
        let mut n = 0u64;
        while Instant::now() < deadline {
            for _ in 0..16 {
                for k in keys.iter_mut() {
                    *k = u64_key(rng.random_range(0..records));
                }
                t.lookup_many(&w, &keys, |_, v| assert_eq!(v.map(<[u8]>::len), Some(128)))
                    .unwrap();
                n += batch as u64;
            }
        }
        n
    });
    println!(
        "lookup_many (uniform, {records} records, {threads} threads, {batch} keys a call, walked {} at a time): {bps:.0} lookups/s",
        shoal_btree::LOOKUP_GROUP
    );
    // Remove everything again (ascending, adjacent ranges, like the load): leaves empty one
    // after another and merge; the tree ends as one root leaf.
    let pages_full = e.store().slots_in_use();
    let t0 = Instant::now();
    each_key_in_ranges(&e, threads, records, |w, k| {
        assert!(t.remove(w, u64_key(k)).unwrap());
    });
    let rms = records as f64 / t0.elapsed().as_secs_f64();
    let pages_empty = e.store().slots_in_use();
    println!(
        "remove (ascending, {threads} threads, adjacent ranges): {rms:.0} removes/s; pages in use {pages_full} -> {pages_empty}"
    );
    println!("{{\"bench\":\"btree\",\"records\":{records},\"threads\":{threads},\"inserts_per_s\":{ins:.0},\"lookups_per_s\":{lps:.0},\"batched_lookups_per_s\":{bps:.0},\"batch\":{batch},\"removes_per_s\":{rms:.0},\"pages_before_removes\":{pages_full},\"pages_after_removes\":{pages_empty}}}");
    drop(e);
}
