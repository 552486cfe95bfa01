//! Multi-node clusters over the `mem` transport: pages move between nodes through the
//! coherence protocol (engine/src/coherence.rs) and stay coherent.
//!
//! Sizes scale with `SHOAL_CLUSTER_SCALE` (default 1): the must-show run of issue 5 is
//! `SHOAL_CLUSTER_SCALE=10` (1.2M increments), recorded in docs/BENCHMARKS.md.

use shoal_engine::{Cluster, EngineConfig, EngineError, OpResult, Pid, Worker};
use shoal_storage::PageStore;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

fn scale() -> u64 {
    std::env::var("SHOAL_CLUSTER_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

fn cluster(dir: &std::path::Path, n: usize, frames: usize) -> Cluster {
    let d = dir.to_path_buf();
    Cluster::mem(n, Duration::from_secs(20), move |i| {
        let mut c = EngineConfig::for_cluster_node(d.join(format!("n{i}")), frames * 4096);
        c.free_target_percent = 10;
        c
    })
    .expect("cluster opens")
}

/// `n` nodes of 512 frames with the default free target, waiting `timeout` for remote pages.
fn cluster_of_512_frames(dir: &std::path::Path, n: usize, timeout: Duration) -> Cluster {
    let d = dir.to_path_buf();
    Cluster::mem(n, timeout, move |i| {
        EngineConfig::for_cluster_node(d.join(format!("n{i}")), 512 * 4096)
    })
    .expect("cluster opens")
}

/// Allocate `count` pages on node `home` of the cluster (zeroed).
fn allocate(w: &Worker, count: usize) -> Vec<Pid> {
    (0..count)
        .map(|_| w.allocate().expect("allocate").pid())
        .collect()
}

/// Allocate `per_node` pages on each of the first `nodes` nodes (in node order).
fn allocate_on_every_node(c: &Cluster, nodes: usize, per_node: usize) -> Vec<Pid> {
    (0..nodes)
        .flat_map(|n| allocate(&c.node(n).worker(), per_node))
        .collect()
}

/// The first `counters` u64 counters of every page in `pids`, read on `node`.
fn read_counters(c: &Cluster, node: usize, pids: &[Pid], counters: usize) -> Vec<u64> {
    let w = c.node(node).worker();
    let mut got = Vec::with_capacity(pids.len() * counters);
    for &p in pids {
        let g = w.shared(p).unwrap();
        for s in 0..counters {
            got.push(g.page().u64(s * 8));
        }
    }
    got
}

/// Words in a page's data area: the torn/stale tests write every one of them.
const WORDS: usize = shoal_engine::PAGE_DATA_SIZE / 8;

/// Rewrite every word of page `pid` with its next version (word 0 plus one), under an
/// exclusive guard; returns that version.
fn rewrite_page(w: &Worker, pid: Pid) -> u64 {
    w.run(|w| -> OpResult<u64> {
        let mut g = w.exclusive(pid)?;
        let v = g.page().u64(0) + 1;
        let mut m = g.page_mut();
        for k in 0..WORDS {
            m.set_u64(k * 8, v);
        }
        Ok(v)
    })
    .expect("rewrite")
}

/// Read every word of page `pid`, optimistically (validated) or under a shared guard. With
/// `torn`, counts optimistic images that were torn before validation rejected them.
fn read_words(w: &Worker, pid: Pid, optimistic: bool, torn: &mut u64) -> Vec<u64> {
    if optimistic {
        w.run(|w| -> OpResult<Vec<u64>> {
            let g = w.optimistic(pid)?;
            let page = g.page();
            let words: Vec<u64> = (0..WORDS).map(|k| page.u64(k * 8)).collect();
            if words.iter().any(|&x| x != words[0]) {
                *torn += 1; // must fail validation below
            }
            g.validate()?;
            Ok(words)
        })
        .expect("optimistic read")
    } else {
        let g = w.run(|w| w.shared(pid)).expect("shared read");
        let page = g.page();
        (0..WORDS).map(|k| page.u64(k * 8)).collect()
    }
}

/// A page image accepted by a reader is one version (not torn), not older than `floor`.
fn check_image(node: usize, p: usize, words: &[u64], floor: u64) {
    assert!(
        words.iter().all(|&x| x == words[0]),
        "node {node} accepted a torn page {p}: {:?}..",
        &words[..4]
    );
    assert!(
        words[0] >= floor,
        "node {node} read version {} of page {p} after version {floor} was committed",
        words[0]
    );
}

#[test]
fn a_page_written_on_one_node_is_read_on_every_other() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), 3, 512);
    let w0 = c.node(0).worker();
    let pids = allocate(&w0, 20);
    for (k, &p) in pids.iter().enumerate() {
        let mut g = w0.exclusive(p).unwrap();
        g.page_mut().set_u64(0, 1000 + k as u64);
    }
    // every node reads every page (shared copies spread)
    for n in 0..3 {
        let w = c.node(n).worker();
        for (k, &p) in pids.iter().enumerate() {
            let v = w
                .run(|w| -> OpResult<u64> {
                    let g = w.optimistic(p)?;
                    let v = g.page().u64(0);
                    g.validate()?;
                    Ok(v)
                })
                .unwrap();
            assert_eq!(v, 1000 + k as u64, "node {n} page {k}");
        }
    }
    // node 2 writes (invalidating the sharers), node 1 and the home read the new value
    let w2 = c.node(2).worker();
    for &p in &pids {
        let mut g = w2.exclusive(p).unwrap();
        let v = g.page().u64(0);
        g.page_mut().set_u64(0, v + 1);
    }
    for n in [1, 0] {
        let w = c.node(n).worker();
        for (k, &p) in pids.iter().enumerate() {
            let g = w.shared(p).unwrap();
            assert_eq!(g.page().u64(0), 1001 + k as u64, "node {n} after the write");
        }
    }
    let s = c.node(2).protocol_stats();
    assert!(s.requests >= 40, "node 2 asked for every page twice: {s:?}");
    assert!(c.node(0).protocol_stats().pages > 0);
    drop((w0, w2));
    c.close().unwrap();
}

#[test]
fn missing_pages_and_nodes_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), 2, 512);
    let w = c.node(1).worker();
    let e = w
        .run(|w| w.shared(Pid::new(0, 1 << 20)).map(|_| ()))
        .unwrap_err();
    assert!(matches!(e, EngineError::NoSuchPage { .. }), "{e}");
    let e = w.run(|w| w.shared(Pid::new(5, 1)).map(|_| ())).unwrap_err();
    assert!(matches!(e, EngineError::NoSuchNode { .. }), "{e}");
    assert!(e.to_string().contains("cluster of 2 nodes"), "{e}");
    drop(w);
    c.close().unwrap();
}

/// Issue 5's must-show: 3 nodes x 2 workers increment counters spread over shared pages under
/// exclusive guards, with caches small enough that eviction runs all the time; the final sums
/// are exact. Then the cluster is closed and reopened and the sums are still exact.
#[test]
fn no_lost_updates_three_nodes_two_workers_with_eviction() {
    const NODES: usize = 3;
    const WORKERS: usize = 2;
    const PAGES_PER_NODE: usize = 300;
    const COUNTERS: usize = 8; // counters per page (u64 at offsets 0, 8, ...)
    let per_worker = 20_000 * scale();
    let dir = tempfile::tempdir().unwrap();
    // 256 frames per node, 900 pages in all: every node's cache holds under a third of them
    let c = Arc::new(cluster(dir.path(), NODES, 256));
    let pids = Arc::new(allocate_on_every_node(&c, NODES, PAGES_PER_NODE));
    let start = Arc::new(Barrier::new(NODES * WORKERS));
    let mut threads = Vec::new();
    for n in 0..NODES {
        for k in 0..WORKERS {
            let (c, pids, start) = (Arc::clone(&c), Arc::clone(&pids), Arc::clone(&start));
            threads.push(std::thread::spawn(move || {
                let w = c.node(n).worker();
                let mut x = (n * 31 + k * 7 + 1) as u64;
                let mut mine = vec![0u64; pids.len() * COUNTERS];
                start.wait();
                for _ in 0..per_worker {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let p = (x % pids.len() as u64) as usize;
                    let slot = ((x >> 32) % COUNTERS as u64) as usize;
                    w.run(|w| -> OpResult<()> {
                        let mut g = w.exclusive(pids[p])?;
                        let v = g.page().u64(slot * 8);
                        g.page_mut().set_u64(slot * 8, v + 1);
                        Ok(())
                    })
                    .expect("increment");
                    mine[p * COUNTERS + slot] += 1;
                }
                mine
            }));
        }
    }
    let mut expect = vec![0u64; pids.len() * COUNTERS];
    for t in threads {
        for (e, m) in expect.iter_mut().zip(t.join().unwrap()) {
            *e += m;
        }
    }
    let total: u64 = expect.iter().sum();
    let read_all = |c: &Cluster, node: usize| read_counters(c, node, &pids, COUNTERS);
    for n in 0..NODES {
        assert!(read_all(&c, n) == expect, "node {n} sees wrong sums");
    }
    let evictions: u64 = c.nodes().iter().map(|e| e.stats().evictions).sum();
    let notices: u64 = c
        .nodes()
        .iter()
        .map(|e| e.protocol_stats().evict_notices)
        .sum();
    assert!(
        evictions > 0 && notices > 0,
        "eviction ran ({evictions} evictions, {notices} notices)"
    );
    eprintln!(
        "{total} increments; {evictions} evictions, {notices} eviction notices; requests {:?}",
        c.nodes()
            .iter()
            .map(|e| e.protocol_stats().requests)
            .collect::<Vec<_>>()
    );
    Arc::try_unwrap(c)
        .ok()
        .expect("threads done")
        .close()
        .unwrap();
    // reopen the same directories: the sums survived
    let c = cluster(dir.path(), NODES, 256);
    assert!(read_all(&c, 1) == expect, "sums after restart");
    c.close().unwrap();
}

/// One pool under memory pressure: 3 nodes x 2 workers, 256-frame caches, 900 pages (more
/// than the cluster's frames), 90% reads and 10% increments. Homes evict their own pages while
/// other nodes hold copies, so shared reads are forwarded to sharers; no read goes backwards
/// (a reader never sees a counter lower than it saw before) and no increment is lost, also
/// after a restart.
#[test]
fn forwarded_reads_under_memory_pressure_lose_no_update_and_read_nothing_stale() {
    const NODES: usize = 3;
    const WORKERS: usize = 2;
    const PAGES_PER_NODE: usize = 300;
    const COUNTERS: usize = 8;
    let per_worker = 20_000 * scale();
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(cluster(dir.path(), NODES, 256));
    let pids = Arc::new(allocate_on_every_node(&c, NODES, PAGES_PER_NODE));
    let start = Arc::new(Barrier::new(NODES * WORKERS));
    let mut threads = Vec::new();
    for n in 0..NODES {
        for k in 0..WORKERS {
            let (c, pids, start) = (Arc::clone(&c), Arc::clone(&pids), Arc::clone(&start));
            threads.push(std::thread::spawn(move || {
                let w = c.node(n).worker();
                let mut x = (n * 131 + k * 17 + 5) as u64;
                let mut mine = vec![0u64; pids.len() * COUNTERS];
                let mut seen = vec![0u64; pids.len() * COUNTERS];
                start.wait();
                for _ in 0..per_worker {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let p = (x % pids.len() as u64) as usize;
                    let slot = ((x >> 32) % COUNTERS as u64) as usize;
                    let at = p * COUNTERS + slot;
                    if (x >> 40).is_multiple_of(10) {
                        let v = w
                            .run(|w| -> OpResult<u64> {
                                let mut g = w.exclusive(pids[p])?;
                                let v = g.page().u64(slot * 8) + 1;
                                g.page_mut().set_u64(slot * 8, v);
                                Ok(v)
                            })
                            .expect("increment");
                        mine[at] += 1;
                        seen[at] = v;
                    } else {
                        let v = w
                            .run(|w| -> OpResult<u64> {
                                Ok(w.shared(pids[p])?.page().u64(slot * 8))
                            })
                            .expect("read");
                        assert!(
                            v >= seen[at],
                            "node {n} read {v} at page {p} slot {slot} after it saw {}",
                            seen[at]
                        );
                        seen[at] = v;
                    }
                }
                mine
            }));
        }
    }
    let mut expect = vec![0u64; pids.len() * COUNTERS];
    for t in threads {
        for (e, m) in expect.iter_mut().zip(t.join().unwrap()) {
            *e += m;
        }
    }
    let read_all = |c: &Cluster, node: usize| read_counters(c, node, &pids, COUNTERS);
    for n in 0..NODES {
        assert!(read_all(&c, n) == expect, "node {n} sees wrong sums");
    }
    let stat = |f: fn(&shoal_engine::ProtocolStats) -> u64| -> u64 {
        c.nodes().iter().map(|e| f(&e.protocol_stats())).sum()
    };
    let (forwarded, served) = (stat(|p| p.forwarded_reads), stat(|p| p.served_for_others));
    assert!(forwarded > 0, "some reads were forwarded to a sharer");
    assert!(
        served <= forwarded,
        "{served} pages served for others, {forwarded} reads forwarded"
    );
    eprintln!(
        "{} increments; {forwarded} reads forwarded to a sharer, {served} served; home store reads {}",
        expect.iter().sum::<u64>(),
        stat(|p| p.home_reads)
    );
    Arc::try_unwrap(c)
        .ok()
        .expect("threads done")
        .close()
        .unwrap();
    let c = cluster(dir.path(), NODES, 256);
    assert!(read_all(&c, 2) == expect, "sums after restart");
    c.close().unwrap();
}

/// A node reading far more pages of another home than it can cache sends its clean eviction
/// notices in batches (several notices per message) and the home answers in batches; every
/// page still reads right, and the reader's frames are freed (it keeps reading).
#[test]
fn clean_eviction_notices_travel_in_batches() {
    const PAGES: usize = 2000;
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), 2, 256);
    let w0 = c.node(0).worker();
    let pids = allocate(&w0, PAGES);
    for (k, &p) in pids.iter().enumerate() {
        let mut g = w0.exclusive(p).unwrap();
        g.page_mut().set_u64(0, 7 * k as u64 + 1);
    }
    let w1 = c.node(1).worker();
    for round in 0..2 {
        for (k, &p) in pids.iter().enumerate() {
            let g = w1.shared(p).unwrap();
            assert_eq!(g.page().u64(0), 7 * k as u64 + 1, "round {round} page {k}");
        }
    }
    let reader = c.node(1).protocol_stats();
    let home = c.node(0).protocol_stats();
    eprintln!("reader {reader:?}\nhome {home:?}");
    // node 1 homes nothing that was read: every batch it sent carried only its notices, about
    // 25 per batch (docs/protocol.md; 3,754 in 165 here on 2026-11-24). Checked by breaking it
    // on purpose: with `prepare_evict` flushing after every notice, 3,778 notices went in
    // 3,778 batches and this failed.
    assert!(
        reader.batches > 0 && reader.evict_notices >= 10 * reader.batches,
        "notices went in batches of 10 or more: {reader:?}"
    );
    // 4,000 remote reads through 256 frames: most copies left by notice
    assert!(reader.evict_notices > PAGES as u64, "{reader:?}");
    // the home's replies went in batches too, fewer messages than notices
    assert!(
        home.batches > 0 && home.batches < reader.evict_notices,
        "{home:?}"
    );
    drop((w0, w1));
    c.close().unwrap();
}

/// One pool, asymmetric caches: node 0 (256 frames) writes 1,200 pages, far more than it can
/// hold; node 1 (4,096 frames) runs no workers. With one pool node 0's evicted pages move to
/// node 1's spare frames (offered, taken in) and node 0's second pass over its pages is
/// served from there (forwarded reads), not from its store; without, every page beyond node
/// 0's cache is read from its store again. Every page reads its own stamp either way, and a
/// write after the move is seen by both nodes.
#[test]
fn a_small_node_borrows_a_large_neighbours_spare_frames() {
    const PAGES: usize = 1200;
    let run =
        |one_pool: bool, tcp: bool| -> (shoal_engine::ProtocolStats, shoal_engine::ProtocolStats) {
            let dir = tempfile::tempdir().unwrap();
            let b = Cluster::builder(2, dir.path())
                .remote_timeout(Duration::from_secs(20))
                .configure(move |i, cfg| {
                    cfg.cache_bytes = if i == 0 { 256 } else { 4096 } * 4096;
                    cfg.one_pool = one_pool;
                });
            let c = if tcp { b.tcp_loopback() } else { b.mem() }.expect("cluster opens");
            let w0 = c.node(0).worker();
            let pids = allocate(&w0, PAGES);
            for (k, &p) in pids.iter().enumerate() {
                let mut g = w0.exclusive(p).unwrap();
                g.page_mut().set_u64(0, 3 * k as u64 + 1);
            }
            // node 1 reports its room every 20 ms; read until the pages settled
            for _ in 0..2 {
                for (k, &p) in pids.iter().enumerate() {
                    assert_eq!(w0.shared(p).unwrap().page().u64(0), 3 * k as u64 + 1);
                }
            }
            let before = c.node(0).protocol_stats();
            for (k, &p) in pids.iter().enumerate() {
                assert_eq!(w0.shared(p).unwrap().page().u64(0), 3 * k as u64 + 1);
            }
            let after = c.node(0).protocol_stats();
            // a write after the move: node 1's copy is invalidated, both read the new value
            {
                let mut g = w0.exclusive(pids[7]).unwrap();
                g.page_mut().set_u64(0, 99);
            }
            let w1 = c.node(1).worker();
            assert_eq!(w1.shared(pids[7]).unwrap().page().u64(0), 99);
            assert_eq!(w0.shared(pids[7]).unwrap().page().u64(0), 99);
            let big = c.node(1).protocol_stats();
            let pass = shoal_engine::ProtocolStats {
                home_reads: after.home_reads - before.home_reads,
                forwarded_reads: after.forwarded_reads - before.forwarded_reads,
                given_away: after.given_away,
                ..Default::default()
            };
            drop((w0, w1));
            c.close().unwrap();
            (pass, big)
        };
    // over tcp too: offers and forwarded pages travel as attachments on real sockets
    let (tcp, tcp_big) = run(true, true);
    assert!(
        tcp.given_away > 0 && tcp_big.taken_in >= tcp.given_away,
        "over tcp: {tcp:?}"
    );
    assert!(
        tcp.forwarded_reads > (PAGES / 2) as u64,
        "over tcp: {tcp:?}"
    );
    let (pool, big) = run(true, false);
    let (plain, _) = run(false, false);
    eprintln!(
        "one pool: last pass store reads {}, forwarded {}; given away {}, taken in {}; plain: store reads {}",
        pool.home_reads, pool.forwarded_reads, pool.given_away, big.taken_in, plain.home_reads
    );
    assert!(pool.given_away > 0 && big.taken_in >= pool.given_away);
    assert!(
        plain.home_reads > (PAGES / 2) as u64,
        "without one pool the pages beyond the cache come from the store: {}",
        plain.home_reads
    );
    assert!(
        pool.home_reads * 4 < plain.home_reads && pool.forwarded_reads > (PAGES / 2) as u64,
        "with one pool they come from node 1: {} store reads, {} forwarded",
        pool.home_reads,
        pool.forwarded_reads
    );
}

/// Copies of pages whose home died: still readable right after the death (nobody can write
/// the page any more), dropped without a notice once evicted (no notice can reach the home),
/// and refused with an error after that, never read wrong; meanwhile the node's own pages,
/// six times its cache, keep being evicted, read and written right. (The path where a home
/// dies while a batch of notices is on its way, `restore_unsent`, is not reached here.)
#[test]
fn copies_whose_home_died_are_read_right_or_refused_under_eviction() {
    const COPIES: usize = 100;
    const OWN: usize = 1500;
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), 2, 256);
    let (w0, w1) = (c.node(0).worker(), c.node(1).worker());
    let on1 = allocate(&w1, COPIES);
    for (k, &p) in on1.iter().enumerate() {
        w1.exclusive(p)
            .unwrap()
            .page_mut()
            .set_u64(0, 1000 + k as u64);
    }
    // node 0 takes clean shared copies of node 1's pages
    for (k, &p) in on1.iter().enumerate() {
        assert_eq!(w0.shared(p).unwrap().page().u64(0), 1000 + k as u64);
    }
    let before = c.node(0).protocol_stats();
    c.kill(1);
    let readable = on1
        .iter()
        .enumerate()
        .filter(|&(k, &p)| {
            w0.run(|w| w.shared(p).map(|g| g.page().u64(0)))
                .is_ok_and(|v| v == 1000 + k as u64)
        })
        .count();
    assert_eq!(readable, COPIES, "copies readable right after the death");
    // node 0's own pages, six times its cache: every frame is evicted over and over, the
    // dead-homed copies included
    let own = allocate(&w0, OWN);
    for round in 0..2u64 {
        for (k, &p) in own.iter().enumerate() {
            let mut g = w0.run(|w| w.exclusive(p)).unwrap();
            assert_eq!(g.page().u64(0), if round == 0 { 0 } else { k as u64 + 1 });
            g.page_mut().set_u64(0, k as u64 + 1);
        }
    }
    let after = c.node(0).protocol_stats();
    eprintln!("node 0 before the death {before:?}\nafter {after:?}");
    let (mut kept, mut lost) = (0, 0);
    for (k, &p) in on1.iter().enumerate() {
        match w0.run(|w| w.shared(p).map(|g| g.page().u64(0))) {
            Ok(v) => {
                assert_eq!(v, 1000 + k as u64, "copy of {p}");
                kept += 1;
            }
            Err(EngineError::PeerDead { node: 1 } | EngineError::HolderDead { holder: 1, .. }) => {
                lost += 1
            }
            Err(e) => panic!("copy of {p}: {e}"),
        }
    }
    eprintln!("{kept} copies kept, {lost} unreadable");
    // untouched through 3,000 accesses of 1,500 pages in 256 frames, every copy was evicted
    // (dropped without a notice) and is refused now; a copy the provider could not drop
    // would still be kept. Checked by breaking it on purpose (2026-11-24): with
    // `prepare_evict` keeping copies of dead homes the test fails earlier, in `allocate`.
    assert_eq!(
        (kept, lost),
        (0, COPIES),
        "copies of the dead home were evicted, then refused"
    );
    for (k, &p) in own.iter().enumerate() {
        assert_eq!(
            w0.run(|w| w.shared(p).map(|g| g.page().u64(0))).unwrap(),
            k as u64 + 1
        );
    }
    drop((w0, w1));
}

/// Every node hammers one page exclusively; each completes its share, none starves.
#[test]
fn fairness_on_one_hot_page() {
    const NODES: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(cluster(dir.path(), NODES, 512));
    let pid = c.node(0).worker().allocate().unwrap().pid();
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..NODES).map(|_| AtomicU64::new(0)).collect());
    let mut threads = Vec::new();
    for n in 0..NODES {
        let (c, stop, counts) = (Arc::clone(&c), Arc::clone(&stop), Arc::clone(&counts));
        threads.push(std::thread::spawn(move || {
            let w = c.node(n).worker();
            while !stop.load(Ordering::Relaxed) {
                w.run(|w| -> OpResult<()> {
                    let mut g = w.exclusive(pid)?;
                    let v = g.page().u64(0);
                    g.page_mut().set_u64(0, v + 1);
                    Ok(())
                })
                .unwrap();
                counts[n].fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // Run until at least 3000 increments in all and every node did at least 3% of them; a
    // node left under that for a minute is starved, and the test says so instead of hanging.
    // (Measured shares 0.19-0.53, 0.31-0.37 in docs/protocol.md; a run can start lopsided
    // and even out, so the share is judged over the run, not at one moment: before
    // 2026-11-27 a snapshot at 1% ended the run and the final counts had to show 3%, which
    // failed about one run in eight on an idle machine, before and after the renovation.)
    let t0 = std::time::Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let v: Vec<u64> = counts.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        let total = v.iter().sum::<u64>();
        if total >= 3000 * scale() && v.iter().all(|&x| x * 100 >= total * 3) {
            break;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            stop.store(true, Ordering::Relaxed);
            panic!("a node starved: per-node increments after 60 s {v:?}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let v: Vec<u64> = counts.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    let total: u64 = v.iter().sum();
    let w = c.node(1).worker();
    assert_eq!(w.shared(pid).unwrap().page().u64(0), total);
    let (min, max) = (*v.iter().min().unwrap(), *v.iter().max().unwrap());
    // Checked by breaking it on purpose (2026-11-24): with the home ignoring node 2's
    // requests the test fails at the 60 s deadline ("a node starved"). With revocation off
    // it still passes: shares 0.07-0.77 on mem, unfair but not starved.
    eprintln!(
        "per-node increments {v:?}: min share {:.3}, max share {:.3}",
        min as f64 / total as f64,
        max as f64 / total as f64
    );
    drop(w);
    Arc::try_unwrap(c)
        .ok()
        .expect("threads done")
        .close()
        .unwrap();
}

/// Writers stamp every word of a page with its version; readers on every node, under
/// optimistic and shared guards, never accept a page mixing two versions, and never see a
/// version older than one whose write completed before their read started.
#[test]
fn no_torn_or_stale_reads() {
    const NODES: usize = 3;
    const PAGES: usize = 12;
    let writes = 1500 * scale();
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(cluster(dir.path(), NODES, 512));
    let pids: Arc<Vec<Pid>> = Arc::new({
        let w = c.node(1).worker();
        allocate(&w, PAGES)
    });
    let committed: Arc<Vec<AtomicU64>> = Arc::new((0..PAGES).map(|_| AtomicU64::new(0)).collect());
    let writers_left = Arc::new(AtomicU64::new(NODES as u64));
    let mut threads = Vec::new();
    for n in 0..NODES {
        let (cl, pl, cm, lf) = (
            Arc::clone(&c),
            Arc::clone(&pids),
            Arc::clone(&committed),
            Arc::clone(&writers_left),
        );
        threads.push(std::thread::spawn(move || {
            let (c, pids, committed, left) = (cl, pl, cm, lf);
            let w = c.node(n).worker();
            for i in 0..writes {
                let p = (i as usize * 7 + n * 5) % PAGES;
                let v = rewrite_page(&w, pids[p]);
                committed[p].fetch_max(v, Ordering::SeqCst);
            }
            left.fetch_sub(1, Ordering::SeqCst);
            (0u64, 0u64, 0u64)
        }));
        let (cl, pl, cm, lf) = (
            Arc::clone(&c),
            Arc::clone(&pids),
            Arc::clone(&committed),
            Arc::clone(&writers_left),
        );
        threads.push(std::thread::spawn(move || {
            let (c, pids, committed, left) = (cl, pl, cm, lf);
            let w = c.node(n).worker();
            let (mut checked, mut optimistic, mut torn_rejected) = (0u64, 0u64, 0u64);
            let mut i = 0usize;
            while left.load(Ordering::SeqCst) > 0 {
                i += 1;
                let p = (i * 5 + n) % PAGES;
                let floor = committed[p].load(Ordering::SeqCst);
                let opt = i.is_multiple_of(2);
                optimistic += u64::from(opt);
                let words = read_words(&w, pids[p], opt, &mut torn_rejected);
                check_image(n, p, &words, floor);
                checked += 1;
            }
            (checked, optimistic, torn_rejected)
        }));
    }
    let (mut checked, mut optimistic, mut torn) = (0, 0, 0);
    for t in threads {
        let (c, o, r) = t.join().unwrap();
        (checked, optimistic, torn) = (checked + c, optimistic + o, torn + r);
    }
    assert!(checked > 100, "readers checked {checked} pages");
    assert!(
        optimistic * 3 >= checked,
        "about half the reads were optimistic: {optimistic} of {checked}"
    );
    // Torn images seen (and rejected by validation) depend on timing, so they are reported,
    // not required; one accepted would have failed the assertion in the reader.
    eprintln!(
        "{checked} reads ({optimistic} optimistic), {torn} torn images seen and rejected, \
         no torn or stale page accepted"
    );
    Arc::try_unwrap(c)
        .ok()
        .expect("threads done")
        .close()
        .unwrap();
}

/// A node dies mid-run: the others get errors (not hangs) for pages that need it, and keep
/// serving the pages that do not.
#[test]
fn a_dead_node_gives_errors_not_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster_of_512_frames(dir.path(), 3, Duration::from_secs(2));
    let (w0, w1, w2) = (c.node(0).worker(), c.node(1).worker(), c.node(2).worker());
    let on0 = allocate(&w0, 4);
    let on1 = allocate(&w1, 4);
    let on2 = allocate(&w2, 4);
    // node 2 takes on0[0] exclusively; everyone reads the rest
    {
        let mut g = w2.exclusive(on0[0]).unwrap();
        g.page_mut().set_u64(0, 77);
    }
    for w in [&w0, &w1] {
        for &p in on0.iter().chain(&on1).chain(&on2).skip(1) {
            w.run(|w| w.shared(p).map(|_| ())).unwrap();
        }
    }
    c.kill(2);
    let t0 = std::time::Instant::now();
    // pages homed on the dead node: an error (node 1 has a shared copy of on2[1]: still
    // readable locally, but writing it needs the dead home)
    let e = w0.run(|w| w.exclusive(on2[1]).map(|_| ())).unwrap_err();
    assert!(matches!(e, EngineError::PeerDead { node: 2 }), "{e}");
    let e = w1.run(|w| w.exclusive(on2[2]).map(|_| ())).unwrap_err();
    assert!(matches!(e, EngineError::PeerDead { node: 2 }), "{e}");
    // a page homed on a live node but held by the dead one: its only current copy is gone,
    // the home refuses it (no waiting for a timeout), and keeps refusing it
    for w in [&w1, &w0, &w1] {
        let e = w.run(|w| w.exclusive(on0[0]).map(|_| ())).unwrap_err();
        assert!(
            matches!(e, EngineError::HolderDead { pid: p, holder: 2 } if p == on0[0]),
            "{e}"
        );
    }
    // everything that does not depend on node 2 keeps working, reads and writes
    for &p in on0.iter().chain(&on1).skip(1) {
        for w in [&w0, &w1] {
            w.run(|w| -> OpResult<()> {
                let mut g = w.exclusive(p)?;
                let v = g.page().u64(8);
                g.page_mut().set_u64(8, v + 1);
                Ok(())
            })
            .unwrap();
        }
        assert_eq!(w0.shared(p).unwrap().page().u64(8), 2);
    }
    eprintln!("errors and continued service within {:?}", t0.elapsed());
    drop((w0, w1, w2));
    // no clean shutdown is possible with a dead member; the engines are dropped
}

/// A node dies holding shared copies: a write that needs it waits at the home until its lease
/// has run out, then the home forgets it as a sharer and the write goes on (no error); the dead node, which in one
/// process goes on running cut off from the others (as a stopped or partitioned process
/// would), never reads a stale copy: its reads fail once its lease has run out. Pages it held
/// exclusively stay refused (their last version may exist only there).
#[test]
fn pages_a_dead_node_held_shared_are_written_again_once_its_lease_ran_out() {
    const HANG: Duration = Duration::from_secs(60);
    let dir = tempfile::tempdir().unwrap();
    let c = cluster_of_512_frames(dir.path(), 3, Duration::from_secs(5));
    let (w0, w1, w2) = (c.node(0).worker(), c.node(1).worker(), c.node(2).worker());
    let shared = allocate(&w0, 8);
    let owned = allocate(&w0, 1)[0];
    for (k, &p) in shared.iter().enumerate() {
        w0.exclusive(p).unwrap().page_mut().set_u64(0, k as u64 + 1);
    }
    // nodes 1 and 2 read every page (shared copies), node 2 takes one page exclusively
    for &p in &shared {
        for w in [&w1, &w2] {
            w.run(|w| w.shared(p).map(|_| ())).unwrap();
        }
    }
    w2.run(|w| w.exclusive(owned).map(|mut g| g.page_mut().set_u64(0, 99)))
        .unwrap();
    c.kill(2);
    let t0 = std::time::Instant::now();
    // node 1 writes every page; a refusal naming node 2 would be an error the fence spares
    let mut refused = 0;
    for (k, &p) in shared.iter().enumerate() {
        loop {
            match w1.run(|w| {
                w.exclusive(p)
                    .map(|mut g| g.page_mut().set_u64(0, 100 + k as u64))
            }) {
                Ok(()) => break,
                Err(EngineError::HolderDead { holder: 2, .. }) => refused += 1,
                Err(e) => panic!("writing {p} on node 1: {e}"),
            }
            assert!(t0.elapsed() < HANG, "hang: {p} never became writable again");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let took = t0.elapsed();
    eprintln!("every page written again {took:?} after the death ({refused} refusals meanwhile)");
    assert_eq!(
        refused, 0,
        "the writes waited for the fence instead of failing"
    );
    for (k, &p) in shared.iter().enumerate() {
        assert_eq!(w0.shared(p).unwrap().page().u64(0), 100 + k as u64);
        assert_eq!(w1.shared(p).unwrap().page().u64(0), 100 + k as u64);
    }
    let stats = c.node(0).protocol_stats();
    assert!(
        stats.dead_sharers_forgotten >= 1,
        "the home forgot the dead sharer: {stats:?}"
    );
    assert_eq!(
        (stats.deaths_noticed, stats.fences_held),
        (1, 1),
        "one death noticed, one fence: {stats:?}"
    );
    // the dead node's copies: never the old value
    for &p in &shared {
        match w2.run(|w| w.shared(p).map(|g| g.page().u64(0))) {
            Ok(v) => panic!("the cut-off node read {p} = {v}, a value overwritten since"),
            Err(EngineError::LeaseLapsed { home: 0, .. } | EngineError::PeerDead { node: 0 }) => {}
            Err(e) => panic!("the cut-off node reading {p}: {e}"),
        }
    }
    // the page it held exclusively: refused, on every live node
    for w in [&w0, &w1] {
        let e = w.run(|w| w.shared(owned).map(|_| ())).unwrap_err();
        assert!(
            matches!(e, EngineError::HolderDead { holder: 2, .. }),
            "{e}"
        );
    }
    assert!(
        c.node(2).protocol_stats().lease_waits >= 1,
        "the cut-off node waited for its lease"
    );
    drop((w0, w1, w2));
}

/// The catalog page lives on node 0; every node registers and finds names through it.
#[test]
fn the_catalog_is_shared_by_every_node() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), 3, 512);
    for n in 0..3 {
        let w = c.node(n).worker();
        let p = w.allocate().unwrap().pid();
        w.catalog_insert(&format!("tree-of-{n}"), p).unwrap();
    }
    for n in 0..3 {
        let w = c.node(n).worker();
        let names: Vec<String> = w
            .catalog_list()
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(
            names,
            vec!["tree-of-0", "tree-of-1", "tree-of-2"],
            "node {n}"
        );
        let p = w.catalog_lookup("tree-of-2").unwrap().unwrap();
        assert_eq!(p.node(), 2);
        assert!(
            w.catalog_insert("tree-of-1", p).is_err(),
            "duplicates refused on node {n}"
        );
    }
    c.close().unwrap();
}

/// Every node reads a page under a shared guard, then upgrades it to exclusive (node-shared to
/// node-exclusive, several nodes at once): no deadlock, no lost update.
#[test]
fn concurrent_upgrades_neither_deadlock_nor_lose_updates() {
    const NODES: usize = 3;
    let per_node = 300 * scale();
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(cluster(dir.path(), NODES, 512));
    let pid = c.node(0).worker().allocate().unwrap().pid();
    let hs: Vec<_> = (0..NODES)
        .map(|n| {
            let c = Arc::clone(&c);
            std::thread::spawn(move || {
                let w = c.node(n).worker();
                for _ in 0..per_node {
                    w.run(|w| -> OpResult<()> {
                        let g = w.shared(pid)?;
                        let v = g.page().u64(0);
                        let mut x = g.to_exclusive()?;
                        assert_eq!(x.page().u64(0), v, "the page changed during the upgrade");
                        x.page_mut().set_u64(0, v + 1);
                        Ok(())
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let w = c.node(2).worker();
    assert_eq!(
        w.shared(pid).unwrap().page().u64(0),
        per_node * NODES as u64
    );
    drop(w);
    Arc::try_unwrap(c)
        .ok()
        .expect("threads done")
        .close()
        .unwrap();
}

#[test]
fn barriers_line_every_node_up_and_fail_on_a_dead_node() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), 3, 256);
    let passed = AtomicU64::new(0);
    std::thread::scope(|s| {
        for n in 0..3 {
            let (c, passed) = (&c, &passed);
            s.spawn(move || {
                for round in 1..=50u64 {
                    // node n dawdles in round n: the others must wait for it
                    if round % 3 == n as u64 {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    passed.fetch_add(1, Ordering::SeqCst);
                    c.node(n).barrier(Duration::from_secs(20)).unwrap();
                    // everyone's arrival for this round happened before anyone passed it
                    assert!(passed.load(Ordering::SeqCst) >= 3 * round, "round {round}");
                }
            });
        }
    });
    c.kill(2);
    let e = c.node(0).barrier(Duration::from_secs(20)).unwrap_err();
    assert!(matches!(e, EngineError::PeerDead { node: 2 }), "{e}");
    // a node that does not come: a timeout naming it (node 1 never enters this barrier)
    let e = c.node(1).barrier(Duration::from_millis(200)).unwrap_err();
    assert!(
        e.to_string().contains("did not arrive") || matches!(e, EngineError::PeerDead { node: 2 }),
        "{e}"
    );
}

/// A cluster of one node (a one-entry cluster file) waits for nobody at a barrier. (It
/// waited for the limit and failed before: no node's arrival was ever recorded for it.)
#[test]
fn a_one_node_cluster_passes_its_barriers() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), 1, 256);
    for _ in 0..3 {
        c.node(0).barrier(Duration::from_secs(30)).unwrap();
    }
    c.close().unwrap();
}

#[test]
fn pages_are_allocated_on_a_chosen_home_from_any_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut pids = Vec::new();
    {
        let c = cluster(dir.path(), 3, 256);
        for n in 0..3usize {
            let w = c.node(n).worker();
            for home in 0..3u8 {
                let mut g = w.allocate_on(home).unwrap();
                assert_eq!(g.pid().node(), home, "node {n} asked for home {home}");
                assert!(g.page().u64(0) == 0 && g.page().u64(4000) == 0, "zeroed");
                g.page_mut().set_u64(8, 100 * n as u64 + home as u64);
                pids.push((g.pid(), 100 * n as u64 + home as u64));
            }
            assert!(w.allocate_on(3).is_err(), "node 3 is outside the cluster");
        }
        // every node reads every page
        for n in 0..3 {
            let w = c.node(n).worker();
            for &(p, v) in &pids {
                assert_eq!(w.shared(p).unwrap().page().u64(8), v, "node {n} reads {p}");
            }
        }
        c.close().unwrap();
    }
    // the pages survive a restart of the cluster, at their homes
    let c = cluster(dir.path(), 3, 256);
    let w = c.node(1).worker();
    for &(p, v) in &pids {
        assert_eq!(w.shared(p).unwrap().page().u64(8), v, "after restart: {p}");
    }
    drop(w);
    c.close().unwrap();
}

/// A cluster whose pages cannot all go home when it is dropped (here the home is cut off
/// first) must not leave a home's store marked clean while another node held a newer image of
/// one of its pages: the store says "unclean" and refuses a plain open. After an orderly
/// `close` the same change survives. (A plain drop sends the pages home: see
/// `a_cluster_dropped_without_close_leaves_stores_that_open_with_every_write`.)
#[test]
fn a_cluster_dropped_with_pages_away_leaves_stores_unclean_not_stale() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), 2, 256);
    let p = {
        let w0 = c.node(0).worker();
        let p = allocate(&w0, 1)[0];
        w0.exclusive(p).unwrap().page_mut().set_u64(0, 1);
        p
    };
    c.close().unwrap();

    // node 1 changes node 0's page, then the cluster goes away without close
    let c = cluster(dir.path(), 2, 256);
    {
        let w1 = c.node(1).worker();
        w1.exclusive(p).unwrap().page_mut().set_u64(0, 2);
    }
    c.kill(0);
    drop(c);
    let err = Cluster::mem(2, Duration::from_secs(20), |i| {
        EngineConfig::for_cluster_node(dir.path().join(format!("n{i}")), 256 * 4096)
    })
    .err()
    .expect("a stale home store must not open as clean");
    assert!(err.to_string().contains("not shut down cleanly"), "{err}");

    // allowed to open anyway, the cluster works (the lost change is the documented cost)
    let c = Cluster::mem(2, Duration::from_secs(20), |i| {
        let mut cfg = EngineConfig::for_cluster_node(dir.path().join(format!("n{i}")), 256 * 4096);
        cfg.allow_unclean = true;
        cfg
    })
    .unwrap();
    let w1 = c.node(1).worker();
    assert_eq!(
        w1.shared(p).unwrap().page().u64(0),
        1,
        "the home's last image"
    );
    w1.exclusive(p).unwrap().page_mut().set_u64(0, 3);
    drop(w1);
    c.close().unwrap();
    // an orderly close brings node 1's change home and marks the stores clean
    let c = cluster(dir.path(), 2, 256);
    assert_eq!(c.node(0).worker().shared(p).unwrap().page().u64(0), 3);
    c.close().unwrap();
}

/// An allocation on another node that times out at its requester leaves no page behind: the
/// home's late answer is handed back and the home frees the page, whose slot the home's next
/// allocation takes again. A requester that waits zero time gives up on nearly every
/// allocation (one whose answer beats it keeps its page).
#[test]
fn allocations_given_up_by_their_requester_are_freed_at_the_home() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let c = Cluster::mem(2, Duration::ZERO, move |i| {
        EngineConfig::for_cluster_node(d.join(format!("n{i}")), 256 * 4096)
    })
    .unwrap();
    let store = c.node(0).store();
    let (w0, w1) = (c.node(0).worker(), c.node(1).worker());
    let mut gave_up = 0;
    for attempt in 0..100 {
        if gave_up == 5 {
            break;
        }
        // no slot is free: the home's allocation takes slot `high`, a fresh one
        let (high, used) = (store.high_water(), store.slots_in_use());
        match w1.allocate_on(0) {
            // the answer was there before the zero timeout was checked
            Ok(g) => drop(g),
            // ... but taking the page was not (that page stays allocated: docs/protocol.md)
            Err(e) if e.to_string().contains("no answer from the cluster") => {}
            Err(e) => {
                assert!(
                    e.to_string().contains("did not answer an allocation"),
                    "{e}"
                );
                gave_up += 1;
                wait_until_freed_and_reused(&w0, store, attempt, high, used);
            }
        }
    }
    assert_eq!(gave_up, 5);
    drop((w0, w1));
    c.close().unwrap();
}

/// The home allocated slot `high` for an allocation its requester gave up on (`used` slots
/// were in use before): wait until the page is freed, then check that the home's next
/// allocation takes that very slot.
fn wait_until_freed_and_reused(
    w0: &Worker,
    store: &PageStore,
    attempt: usize,
    high: u64,
    used: u64,
) {
    let t0 = std::time::Instant::now();
    while store.high_water() == high || store.slots_in_use() != used {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "attempt {attempt}: {} slots in use, {used} before the allocation; high water {}, \
             {high} before",
            store.slots_in_use(),
            store.high_water()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let g = w0.allocate().unwrap();
    assert_eq!(g.pid().slot(), high, "attempt {attempt}");
}

/// A transport whose writes fail on demand while the peer stays alive (as a send does when the
/// peer stops taking messages for longer than the credit timeout).
struct Flaky {
    inner: Arc<shoal_messaging::MemTransport>,
    fail: AtomicBool,
}

impl shoal_messaging::Transport for Flaky {
    fn node(&self) -> u8 {
        self.inner.node()
    }
    fn nodes(&self) -> u8 {
        self.inner.nodes()
    }
    fn region(&self) -> &shoal_messaging::Region {
        self.inner.region()
    }
    fn write(&self, peer: u8, offset: usize, data: &[u8]) -> Result<(), shoal_messaging::MsgError> {
        if self.fail.load(Ordering::Relaxed) {
            return Err(shoal_messaging::MsgError::Io(
                "injected write failure".into(),
            ));
        }
        self.inner.write(peer, offset, data)
    }
    fn peer_alive(&self, peer: u8) -> bool {
        self.inner.peer_alive(peer)
    }
    fn sever(&self, peer: u8) {
        self.inner.sever(peer)
    }
}

/// Eviction notices that cannot leave (every send of the node fails for a while) do not lose
/// their copies: the batch fails, the copies become idle again and stay readable
/// (`restore_unsent`), the node keeps evicting its own pages, and once sends work again the
/// notices go out and the pages stay coherent (the home writes them, the node reads the news).
#[test]
fn eviction_notices_that_cannot_leave_keep_their_copies() {
    const REMOTE: usize = 100;
    const OWN: usize = 1500;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let layout = shoal_messaging::ChannelLayout::new(2);
    let regions = (0..2).map(|_| layout.region().unwrap()).collect();
    let flaky: Vec<Arc<Flaky>> = shoal_messaging::mem_cluster(regions)
        .unwrap()
        .into_iter()
        .map(|inner| {
            Arc::new(Flaky {
                inner,
                fail: AtomicBool::new(false),
            })
        })
        .collect();
    let dyns = flaky
        .iter()
        .map(|f| Arc::clone(f) as Arc<dyn shoal_messaging::Transport>)
        .collect();
    let c = Cluster::over(dyns, Duration::from_secs(20), move |i| {
        let mut c = EngineConfig::for_cluster_node(d.join(format!("n{i}")), 256 * 4096);
        c.free_target_percent = 10;
        // Without one pool: with it node 1 offers its evicted pages to node 0 (which has
        // room), and a write of such a page needs an invalidation sent to node 0, which this
        // transport drops while the peer stays alive (the protocol assumes no message to a
        // live peer is lost: docs/protocol.md, Messages). Node 1's churn would then wait for
        // ever, which is not what this test is about.
        c.one_pool = false;
        c
    })
    .unwrap();
    let (w0, w1) = (c.node(0).worker(), c.node(1).worker());
    let remote = allocate(&w0, REMOTE);
    for (k, &p) in remote.iter().enumerate() {
        w0.exclusive(p).unwrap().page_mut().set_u64(0, k as u64);
    }
    let own = allocate(&w1, OWN);
    let churn = |round: u64| {
        for (k, &p) in own.iter().enumerate() {
            let mut g = w1.run(|w| w.exclusive(p)).unwrap();
            assert_eq!(g.page().u64(0), round * k as u64, "own page {k}");
            g.page_mut().set_u64(0, (round + 1) * k as u64);
        }
    };
    churn(0);
    // node 1 takes clean shared copies, the newest pages in its cache
    for (k, &p) in remote.iter().enumerate() {
        assert_eq!(w1.shared(p).unwrap().page().u64(0), k as u64);
    }
    let before = c.node(1).protocol_stats();
    flaky[1].fail.store(true, Ordering::Relaxed);
    churn(1);
    churn(2);
    let after = c.node(1).protocol_stats();
    assert!(
        after.evict_notices > before.evict_notices,
        "the copies' eviction was tried while sends failed: {before:?} {after:?}"
    );
    for (k, &p) in remote.iter().enumerate() {
        let v = w1.run(|w| w.shared(p).map(|g| g.page().u64(0)));
        assert_eq!(v.unwrap(), k as u64, "copy of {p} while sends fail");
    }
    flaky[1].fail.store(false, Ordering::Relaxed);
    churn(3);
    for (k, &p) in remote.iter().enumerate() {
        let mut g = w0.run(|w| w.exclusive(p)).unwrap();
        g.page_mut().set_u64(0, k as u64 + 1000);
    }
    for (k, &p) in remote.iter().enumerate() {
        let v = w1.run(|w| w.shared(p).map(|g| g.page().u64(0)));
        assert_eq!(v.unwrap(), k as u64 + 1000, "{p} after sends work again");
    }
    drop((w0, w1));
    c.close().unwrap();
}

/// Issue 24's stress: every node's workers take handler roles (theirs, and on `mem` the other
/// nodes') while eviction runs on every node and homes read pages back from the store outside
/// the role. Writers rewrite whole pages (every word the page's new version); readers check
/// that no page they accept is torn or older than a version already committed; at the end every
/// page's version is exactly the number of increments made to it.
#[test]
fn workers_taking_handler_roles_while_eviction_runs_lose_no_update_and_read_nothing_stale() {
    const NODES: usize = 3;
    const PAGES_PER_NODE: usize = 400;
    const FRAMES: usize = 256; // 768 frames in all for 1200 pages: homes read from their stores
    let writes = 8_000 * scale();
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(cluster(dir.path(), NODES, FRAMES));
    let mut pids = Vec::new();
    for n in 0..NODES {
        pids.extend(allocate(&c.node(n).worker(), PAGES_PER_NODE));
    }
    let pids = Arc::new(pids);
    let committed: Arc<Vec<AtomicU64>> =
        Arc::new((0..pids.len()).map(|_| AtomicU64::new(0)).collect());
    let writers_left = Arc::new(AtomicU64::new(NODES as u64));
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for n in 0..NODES {
        let (c2, p2, k2, l2) = (
            Arc::clone(&c),
            Arc::clone(&pids),
            Arc::clone(&committed),
            Arc::clone(&writers_left),
        );
        writers.push(std::thread::spawn(move || {
            let (c, pids, committed, left) = (c2, p2, k2, l2);
            let w = c.node(n).worker();
            let mut mine = vec![0u64; pids.len()];
            let mut x = n as u64 * 7919 + 1;
            for _ in 0..writes {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let p = (x % pids.len() as u64) as usize;
                let v = rewrite_page(&w, pids[p]);
                committed[p].fetch_max(v, Ordering::SeqCst);
                mine[p] += 1;
            }
            left.fetch_sub(1, Ordering::SeqCst);
            mine
        }));
        let (c2, p2, k2, l2) = (
            Arc::clone(&c),
            Arc::clone(&pids),
            Arc::clone(&committed),
            Arc::clone(&writers_left),
        );
        readers.push(std::thread::spawn(move || {
            let (c, pids, committed, left) = (c2, p2, k2, l2);
            let w = c.node(n).worker();
            let mut checked = 0u64;
            let mut x = n as u64 * 104_729 + 3;
            while left.load(Ordering::SeqCst) > 0 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let p = (x % pids.len() as u64) as usize;
                let floor = committed[p].load(Ordering::SeqCst);
                let words = read_words(&w, pids[p], x & 1 == 0, &mut 0);
                check_image(n, p, &words, floor);
                checked += 1;
            }
            checked
        }));
    }
    let mut expect = vec![0u64; pids.len()];
    for t in writers {
        for (e, m) in expect.iter_mut().zip(t.join().unwrap()) {
            *e += m;
        }
    }
    let checked: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(checked > 100, "readers checked {checked} pages");
    for n in 0..NODES {
        let w = c.node(n).worker();
        for (i, &p) in pids.iter().enumerate() {
            let g = w.shared(p).unwrap();
            assert_eq!(g.page().u64(0), expect[i], "node {n}, page {i}: increments");
        }
    }
    for (n, e) in c.nodes().iter().enumerate() {
        let (s, ps) = (e.stats(), e.protocol_stats());
        assert!(s.evictions > 0, "node {n} evicted ({s:?})");
        assert!(
            ps.helped > 0,
            "waiting workers applied messages at node {n} ({ps:?})"
        );
        assert!(
            ps.home_reads > 0,
            "node {n} read home copies from its store ({ps:?})"
        );
    }
    eprintln!(
        "{} increments, {checked} checked reads; helped {:?}, home reads {:?}",
        expect.iter().sum::<u64>(),
        c.nodes()
            .iter()
            .map(|e| e.protocol_stats().helped)
            .collect::<Vec<_>>(),
        c.nodes()
            .iter()
            .map(|e| e.protocol_stats().home_reads)
            .collect::<Vec<_>>()
    );
    Arc::try_unwrap(c)
        .ok()
        .expect("threads done")
        .close()
        .unwrap();
}

/// Issue 28: a cluster dropped without `close()` (an early `?`, a panic) closes itself: its
/// nodes' foreign pages go home first, so every store opens again without `allow_unclean`
/// and holds the last writes, made by another node than the pages' home.
#[test]
fn a_cluster_dropped_without_close_leaves_stores_that_open_with_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), 2, 256);
    let pids = allocate(&c.node(1).worker(), 50);
    let w0 = c.node(0).worker();
    for &pid in &pids {
        for _ in 0..3 {
            rewrite_page(&w0, pid); // node 0 holds them dirty, node 1 is their home
        }
    }
    drop(w0);
    drop(c);
    let c = cluster(dir.path(), 2, 256);
    let w = c.node(0).worker();
    let mut torn = 0;
    for &pid in &pids {
        assert_eq!(read_words(&w, pid, false, &mut torn)[0], 3, "page {pid}");
    }
    drop(w);
    c.close().unwrap();
}

/// Issue 28: `Cluster::builder(..).tcp_loopback()` opens a cluster whose nodes talk over real
/// tcp sockets (with a secret) in one process: a page homed on node 1 and written from node
/// 0 reads back everywhere, and after a clean close the same directories open as a `mem`
/// cluster with the write in place.
#[test]
fn a_builder_opens_a_tcp_cluster_in_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::builder(2, dir.path())
        .cache_bytes(8 << 20)
        .tcp_loopback()
        .expect("a tcp cluster on loopback");
    let pid = allocate(&c.node(1).worker(), 1)[0];
    let v = rewrite_page(&c.node(0).worker(), pid);
    let mut torn = 0;
    assert_eq!(read_words(&c.node(1).worker(), pid, false, &mut torn)[0], v);
    c.close().unwrap();
    drop(c);
    let c = Cluster::builder(2, dir.path())
        .cache_bytes(8 << 20)
        .mem()
        .unwrap();
    assert_eq!(read_words(&c.node(0).worker(), pid, true, &mut torn)[0], v);
    c.close().unwrap();
}
