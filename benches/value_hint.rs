//! The value hint (`shoal_btree::value_hint`) measured in one process: lookups of 8-byte keys,
//! uniform random, on 2 threads, while the hint is switched on and off every 100 ms; each
//! mode's lookups are counted over the time it was on. Comparing in one process, rather than
//! across separate runs, keeps the machine's drift (10% from minute to minute on the 2-core
//! VM) out of the difference.
//!
//! Run: `cargo bench -p shoal-benches --bench value_hint` with SHOAL_BTREE_RECORDS (default
//! 2M), SHOAL_BTREE_CACHE (default 6GiB), SHOAL_BENCH_SECS (default 20),
//! SHOAL_HINT_ORDER=ascending|random (the load's key order, default ascending) and
//! SHOAL_HINT_VALUES=fixed|spread (128 bytes, or 32..160 bytes by key; default fixed).

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use shoal_benches::{bench_dir, bench_secs};
use shoal_btree::{u64_key, value_hint, BTree};
use shoal_engine::{parse_bytes, Engine};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const THREADS: u64 = 2;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn main() {
    let records = parse_bytes(&env("SHOAL_BTREE_RECORDS", "2000000")).expect("a number");
    let cache = parse_bytes(&env("SHOAL_BTREE_CACHE", "6GiB")).expect("a size") as usize;
    let random = env("SHOAL_HINT_ORDER", "ascending") == "random";
    let spread = env("SHOAL_HINT_VALUES", "fixed") == "spread";
    let secs = bench_secs(20);
    let dir = bench_dir();
    let e = Engine::open(shoal_benches::config(dir.path(), cache)).unwrap();
    let t = BTree::create(&e.worker(), "bench").unwrap();
    let value_len = |k: u64| {
        if spread {
            32 + (k * 7919 % 129) as usize
        } else {
            128
        }
    };
    std::thread::scope(|s| {
        for th in 0..THREADS {
            let e = &e;
            s.spawn(move || {
                let w = e.worker();
                let mut keys: Vec<u64> =
                    (records * th / THREADS..records * (th + 1) / THREADS).collect();
                if random {
                    keys.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(th + 77));
                }
                for k in keys {
                    assert!(t
                        .insert(&w, u64_key(k), vec![7u8; value_len(k)])
                        .unwrap()
                        .inserted());
                }
            });
        }
    });
    let on = AtomicBool::new(true);
    let stop = AtomicBool::new(false);
    let ops = [AtomicU64::new(0), AtomicU64::new(0)];
    let mut time = [Duration::ZERO; 2];
    std::thread::scope(|s| {
        for th in 0..THREADS {
            let (on, stop, ops, e) = (&on, &stop, &ops, &e);
            s.spawn(move || {
                let w = e.worker();
                let mut rng = rand::rngs::SmallRng::seed_from_u64(th);
                let mut buf = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let m = on.load(Ordering::Relaxed);
                    for _ in 0..1024 {
                        let k = rng.random_range(0..records);
                        assert!(t.lookup(&w, u64_key(k), &mut buf).unwrap());
                        assert_eq!(buf.len(), value_len(k));
                    }
                    // count the batch only if the mode did not change under it
                    if on.load(Ordering::Relaxed) == m {
                        ops[m as usize].fetch_add(1024, Ordering::Relaxed);
                    }
                }
            });
        }
        let t0 = Instant::now();
        let mut m = true;
        while t0.elapsed() < secs {
            value_hint::set_enabled(m);
            on.store(m, Ordering::Relaxed);
            let a = Instant::now();
            std::thread::sleep(Duration::from_millis(100));
            time[m as usize] += a.elapsed();
            m = !m;
        }
        stop.store(true, Ordering::Relaxed);
    });
    value_hint::set_enabled(true);
    let rate = |m: usize| ops[m].load(Ordering::Relaxed) as f64 / time[m].as_secs_f64();
    let (off, on) = (rate(0), rate(1));
    println!(
        "lookups ({records} records, {} load, {} values, cache {} MiB, {THREADS} threads): hint off {off:.0}/s, on {on:.0}/s ({:+.1}%)",
        if random { "random-order" } else { "ascending" },
        if spread { "32..160-byte" } else { "128-byte" },
        cache >> 20,
        (on / off - 1.0) * 100.0
    );
    println!("{{\"bench\":\"value_hint\",\"records\":{records},\"random_order\":{random},\"spread_values\":{spread},\"lookups_per_s_off\":{off:.0},\"lookups_per_s_on\":{on:.0}}}");
}
