//! Coherence protocol benchmarks (issue 5), over `mem` and over `tcp` on loopback:
//!
//! 1. remote page fetch latency: node 1 reads pages homed on node 0 that it has never seen
//!    (the base case: request, grant with the page), median and p99.9;
//! 2. messages per remote miss by case, counted by the nodes' protocol counters, next to the
//!    protocol's minimum;
//! 3. the contended single-page workload: every node increments one page under exclusive
//!    guards (anticipatory chaining moves it in request order); throughput and per-node share;
//! 4. the latency ladder (issue 24): a local hit, a remote DRAM fetch and an NVMe read of one
//!    page, median and p99 side by side, all measured here on this machine (the NVMe read is a
//!    one-node engine's miss on a store opened with an empty cache: O_DIRECT, no page cache);
//!    beside each, the CPU time it costs (issue 46): the whole process's user and system time
//!    over the step, divided by its operations. Every node runs in this process, so a remote
//!    fetch's CPU is both ends' (requester, home, handler threads, tcp readers and writers).
//!    With one thread fetching, CPU above the mean latency is other threads working (or
//!    polling) at the same time;
//! 5. remote fetches both ways under load: nodes 0 and 1 each run two threads that fetch pages
//!    homed on the other node at the same time (four threads on the cores, as `shoal ycsb
//!    --nodes 2 --workers 2` runs), with the same latency and CPU figures, in the ladder's
//!    table.
//!
//! `cargo bench -p shoal-benches --bench coherence` (`SHOAL_BENCH_QUICK=1`: fewer pages;
//! `SHOAL_BENCH_TRANSPORTS=mem` or `tcp`: only that transport; `SHOAL_BENCH_DIR`: where the
//! NVMe ladder step's store goes; `SHOAL_BENCH_ONLY=fetch`: only the remote fetch and local hit
//! steps, e.g. to profile them, with `SHOAL_BENCH_FETCH_ROUNDS=N` to fetch every page N times).

use hdrhistogram::Histogram;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use shoal_engine::{ChannelLayout, Cluster, Engine, EngineConfig, OpResult, OpenMode, Pid};
use shoal_messaging::Transport;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

fn cfg(dir: &std::path::Path, i: u8) -> EngineConfig {
    EngineConfig::for_cluster_node(dir.join(format!("n{i}")), 256 << 20)
}

fn mem(n: usize, dir: &std::path::Path) -> Cluster {
    let d = dir.to_path_buf();
    Cluster::mem(n, Duration::from_secs(30), move |i| cfg(&d, i)).unwrap()
}

fn tcp(n: usize, dir: &std::path::Path) -> Cluster {
    let layout = ChannelLayout::new(n as u8);
    let ts: Vec<Arc<dyn Transport>> =
        shoal_benches::loopback_tcp(n, || layout.region().expect("channel region"), false)
            .into_iter()
            .map(|t| t as Arc<dyn Transport>)
            .collect();
    let d = dir.to_path_buf();
    Cluster::over(ts, Duration::from_secs(30), move |i| cfg(&d, i)).unwrap()
}

fn total_messages(c: &Cluster) -> u64 {
    c.nodes().iter().map(|e| e.protocol_stats().messages).sum()
}

type Hist = Histogram<u64>;

fn hist() -> Hist {
    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

/// The CPU time this process has used so far, every thread's user and system time.
fn process_cpu() -> Duration {
    // SAFETY: `rusage` holds only integers, so all-zero bytes are a valid value of it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable `rusage` for the whole call, which writes only into it.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(
        rc, 0,
        "getrusage(RUSAGE_SELF) with a valid pointer cannot fail"
    );
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(ru.ru_utime) + time(ru.ru_stime)
}

/// One step of the ladder: each operation's latency, and the process's CPU per operation.
struct Step {
    latency: Hist,
    cpu_us: f64,
}

impl Step {
    fn cpu_per_op(cpu: Duration, ops: usize) -> f64 {
        cpu.as_secs_f64() * 1e6 / ops.max(1) as f64
    }
}

/// Remote fetch latency and the local hit latency of the same pages afterwards, with their
/// CPU.
fn fetch_latency(name: &str, c: &Cluster, pages: usize) -> (Step, Step) {
    let w0 = c.node(0).worker();
    let pids: Vec<Pid> = (0..pages).map(|_| w0.allocate().unwrap().pid()).collect();
    // a new page is held exclusively by the node that allocated it: node 2 reads every page
    // once (node 0 hands it over and copies it back home), so node 0's directory has one
    // sharer and node 1's first read is the base case
    let w2 = c.node(2).worker();
    for &p in &pids {
        drop(w2.shared(p).unwrap());
    }
    let w1 = c.node(1).worker();
    // Warm-up: node 1 reads the pages once and sends them home again, so that the measured
    // reads land in frames whose memory the kernel has already mapped (a first touch of page
    // memory costs a page fault that zeroes a 2 MiB huge page: a steady-state engine does not
    // pay it, and it would dominate the tail here).
    for &p in &pids {
        drop(w1.shared(p).unwrap());
    }
    c.node(1)
        .send_pages_home(Duration::from_secs(30))
        .expect("node 1's copies go home");
    // SHOAL_BENCH_FETCH_ROUNDS=N: fetch every page N times (sending them home in between), so
    // that a profile of the run is mostly remote fetches; the figures are of all rounds
    let rounds: usize = std::env::var("SHOAL_BENCH_FETCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    let mut h = hist();
    let m0 = total_messages(c);
    // the CPU of the fetches only (sending the copies home between rounds is not counted)
    let mut cpu = Duration::ZERO;
    for r in 0..rounds {
        if r > 0 {
            c.node(1)
                .send_pages_home(Duration::from_secs(30))
                .expect("node 1's copies go home");
        }
        let cpu0 = process_cpu();
        for &p in &pids {
            let t = Instant::now();
            let g = w1.shared(p).unwrap();
            h.record(t.elapsed().as_nanos() as u64).unwrap();
            drop(g);
        }
        cpu += process_cpu() - cpu0;
    }
    let pages_read = pages * rounds;
    let msgs = (total_messages(c) - m0) as f64 / pages_read as f64;
    let remote = Step {
        cpu_us: Step::cpu_per_op(cpu, pages_read),
        latency: h,
    };
    println!(
        "{name}: remote fetch (base case, {pages_read} pages): median {:.1} us, p99 {:.1} us, p99.9 {:.1} us, {:.2} us of CPU; {msgs:.2} messages per miss (minimum 2: request, grant with the page)",
        us(&remote.latency, 0.5),
        us(&remote.latency, 0.99),
        us(&remote.latency, 0.999),
        remote.cpu_us,
    );
    // local hits of the same pages, for scale (each timed: the clock's own cost, some 20-40
    // ns, is in the figure)
    let mut local = hist();
    let cpu0 = process_cpu();
    for &p in &pids {
        let t = Instant::now();
        let g = w1.shared(p).unwrap();
        local.record(t.elapsed().as_nanos() as u64).unwrap();
        drop(g);
    }
    let local = Step {
        cpu_us: Step::cpu_per_op(process_cpu() - cpu0, pages),
        latency: local,
    };
    (remote, local)
}

/// Threads per node in [`both_ways`].
const LOADED_THREADS: usize = 2;

/// Remote fetches under load: nodes 0 and 1 each run [`LOADED_THREADS`] threads that read, at
/// the same time, pages homed on the other node (`pages` per node, split between its threads),
/// `rounds` times; between rounds, with the threads waiting, both nodes send their copies
/// home. Each fetch's latency, and the process's CPU over the fetching phases per fetch.
fn both_ways(name: &str, c: &Cluster, pages: usize, rounds: usize) -> Step {
    let homed: Vec<Vec<Pid>> = (0..2)
        .map(|home| {
            let w = c.node(home).worker();
            (0..pages).map(|_| w.allocate().unwrap().pid()).collect()
        })
        .collect();
    let send_home = || {
        for n in 0..2 {
            c.node(n)
                .send_pages_home(Duration::from_secs(30))
                .expect("copies go home");
        }
    };
    // warm-up, as in `fetch_latency`: the frames the measured fetches land in are mapped
    for n in 0..2 {
        let w = c.node(n).worker();
        for &p in &homed[1 - n] {
            drop(w.shared(p).unwrap());
        }
    }
    send_home();
    let threads = 2 * LOADED_THREADS;
    // each round: the main thread and every fetching thread meet at `go`, then at `done`
    let (go, done) = (Barrier::new(threads + 1), Barrier::new(threads + 1));
    let all = Mutex::new(hist());
    let mut cpu = Duration::ZERO;
    let mut fetching = Duration::ZERO;
    std::thread::scope(|s| {
        for n in 0..2 {
            let chunk = pages.div_ceil(LOADED_THREADS);
            for mine in homed[1 - n].chunks(chunk) {
                let (go, done, all) = (&go, &done, &all);
                s.spawn(move || {
                    let w = c.node(n).worker();
                    let mut h = hist();
                    for _ in 0..rounds {
                        go.wait();
                        for &p in mine {
                            let t = Instant::now();
                            let g = w.shared(p).unwrap();
                            h.record(t.elapsed().as_nanos() as u64).unwrap();
                            drop(g);
                        }
                        done.wait();
                    }
                    all.lock().unwrap().add(&h).unwrap();
                });
            }
        }
        for r in 0..rounds {
            if r > 0 {
                send_home();
            }
            let (cpu0, t0) = (process_cpu(), Instant::now());
            go.wait();
            done.wait();
            cpu += process_cpu() - cpu0;
            fetching += t0.elapsed();
        }
    });
    let fetches = 2 * pages * rounds;
    let step = Step {
        latency: all.into_inner().unwrap(),
        cpu_us: Step::cpu_per_op(cpu, fetches),
    };
    println!(
        "{name}: remote fetches both ways, 2 nodes x {LOADED_THREADS} threads ({fetches} fetches): {:.0} fetches/s, median {:.1} us, p99 {:.1} us, {:.2} us of CPU per fetch",
        fetches as f64 / fetching.as_secs_f64(),
        us(&step.latency, 0.5),
        us(&step.latency, 0.99),
        step.cpu_us,
    );
    step
}

/// NVMe read latency through a one-node engine: a store of 4x the cache, opened again with an
/// empty cache, read in a random order so that every timed read misses (the first cache-full
/// of reads is a warm-up that touches the frames' memory once).
fn nvme_read_latency(pages: usize) -> Step {
    let dir = shoal_benches::bench_dir();
    let frames = (pages / 4).max(1024);
    let mut cfg = shoal_benches::config(&dir.path().join("nvme"), frames * shoal_engine::PAGE_SIZE);
    let mut pids = Vec::with_capacity(frames * 4);
    {
        let e = Engine::open(cfg.clone()).unwrap();
        let w = e.worker();
        for i in 0..frames * 4 {
            let mut g = w.allocate().unwrap();
            g.page_mut().set_u64(0, i as u64);
            pids.push(g.pid());
        }
        drop(w);
        e.close().unwrap();
    }
    cfg.mode = OpenMode::Open;
    let e = Engine::open(cfg).unwrap();
    let w = e.worker();
    pids.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(7));
    let mut h = hist();
    let mut cpu0 = process_cpu();
    for (i, &p) in pids.iter().enumerate() {
        if i == frames {
            cpu0 = process_cpu();
        }
        let t = Instant::now();
        let g = w.shared(p).unwrap();
        let ns = t.elapsed().as_nanos() as u64;
        drop(g);
        if i >= frames {
            h.record(ns).unwrap();
        }
    }
    let cpu = process_cpu() - cpu0;
    let s = e.stats();
    assert!(
        s.store_reads >= pids.len() as u64,
        "every page was read from the device ({} reads for {} pages)",
        s.store_reads,
        pids.len()
    );
    drop(w);
    e.close().unwrap();
    Step {
        cpu_us: Step::cpu_per_op(cpu, pids.len() - frames),
        latency: h,
    }
}

fn us(h: &Hist, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1e3
}

fn messages_by_case(name: &str, c: &Cluster, pages: usize) {
    let (w0, w1, w2) = (c.node(0).worker(), c.node(1).worker(), c.node(2).worker());
    let pids: Vec<Pid> = (0..pages).map(|_| w0.allocate().unwrap().pid()).collect();
    // exclusive conflict: node 1 holds each page exclusively, node 2 wants it exclusively
    for &p in &pids {
        drop(w1.exclusive(p).unwrap());
    }
    let m0 = total_messages(c);
    for &p in &pids {
        drop(w2.exclusive(p).unwrap());
    }
    let excl = (total_messages(c) - m0) as f64 / pages as f64;
    // shared conflict: nodes 1 and 2 share each page, node 0 (the home) wants it exclusively
    for &p in &pids {
        drop(w1.shared(p).unwrap());
        drop(w2.shared(p).unwrap());
    }
    let m0 = total_messages(c);
    for &p in &pids {
        drop(w0.exclusive(p).unwrap());
    }
    let shared = (total_messages(c) - m0) as f64 / pages as f64;
    println!(
        "{name}: messages per miss: exclusive conflict {excl:.2} (minimum 4: request, grant naming the owner, transfer, page); \
         shared conflict with 2 sharers at the home {shared:.2} (minimum 4: 2 invalidations + 2 acks; the home's own request and grant are local)"
    );
}

fn contended(name: &str, c: &Arc<Cluster>, secs: f64) {
    let pid = c.node(0).worker().allocate().unwrap().pid();
    let n = c.nodes().len();
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let r0: u64 = c.nodes().iter().map(|e| e.protocol_stats().requests).sum();
    let start = Arc::new(std::sync::Barrier::new(n + 1));
    let hs: Vec<_> = (0..n)
        .map(|i| {
            let (c, stop, counts) = (Arc::clone(c), Arc::clone(&stop), Arc::clone(&counts));
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                let w = c.node(i).worker();
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    w.run(|w| -> OpResult<()> {
                        let mut g = w.exclusive(pid)?;
                        let v = g.page().u64(0);
                        g.page_mut().set_u64(0, v + 1);
                        Ok(())
                    })
                    .unwrap();
                    counts[i].fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let secs = t0.elapsed().as_secs_f64();
    let v: Vec<u64> = counts.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    let total: u64 = v.iter().sum();
    let transfers: u64 = c
        .nodes()
        .iter()
        .map(|e| e.protocol_stats().requests)
        .sum::<u64>()
        - r0;
    println!(
        "{name}: one page, {n} nodes x 1 worker, exclusive increments: {:.0} ops/s, {transfers} possession requests; per-node ops {v:?} (min share {:.2}, max {:.2})",
        total as f64 / secs,
        *v.iter().min().unwrap() as f64 / total as f64,
        *v.iter().max().unwrap() as f64 / total as f64
    );
}

fn main() {
    let quick = std::env::var("SHOAL_BENCH_QUICK").is_ok();
    let pages = if quick { 2_000 } else { 20_000 };
    // SHOAL_BENCH_TRANSPORTS=mem (or tcp): only those (e.g. to profile one)
    let only = std::env::var("SHOAL_BENCH_TRANSPORTS").ok();
    let fetch_only = std::env::var("SHOAL_BENCH_ONLY").is_ok_and(|o| o == "fetch");
    let mut ladder = Vec::new();
    for (name, make) in [
        ("mem", mem as fn(usize, &std::path::Path) -> Cluster),
        ("tcp", tcp),
    ] {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|t| t == name))
        {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let c = Arc::new(make(3, dir.path()));
        let (remote, local) = fetch_latency(name, &c, pages);
        let loaded = both_ways(name, &c, pages, if quick { 2 } else { 3 });
        ladder.push((name, remote, local, loaded));
        if !fetch_only {
            messages_by_case(name, &c, pages / 10);
            contended(name, &c, if quick { 1.0 } else { 5.0 });
        }
        Arc::try_unwrap(c).ok().unwrap().close().unwrap();
    }
    let nvme = (!fetch_only).then(|| nvme_read_latency(pages));
    println!(
        "\nlatency ladder (one page; us; CPU: the process's, both ends of a fetch, per operation):"
    );
    println!(
        "{:<40} {:>8} {:>8} {:>8} {:>8}",
        "", "mean", "median", "p99", "CPU"
    );
    let row = |what: String, s: &Step| {
        println!(
            "{what:<40} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            s.latency.mean() / 1e3,
            us(&s.latency, 0.5),
            us(&s.latency, 0.99),
            s.cpu_us
        )
    };
    for (name, remote, local, loaded) in &ladder {
        row(format!("local hit ({name} node)"), local);
        row(format!("remote DRAM ({name})"), remote);
        row(
            format!("remote DRAM ({name}), both ways, 2x{LOADED_THREADS} threads"),
            loaded,
        );
    }
    if let Some(nvme) = nvme {
        row("NVMe read (one node)".into(), &nvme);
    }
}
