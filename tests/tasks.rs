//! Tasks (shoal_engine::tasks): many tasks per thread on a page set larger than the cache, so
//! that tasks pause for reads, meet frames other tasks of their thread are loading, and hold
//! guards while they do (lock coupling). No update may be lost, no torn page accepted, and
//! the run may not stall (a watchdog fails the test instead of hanging CI).

use rand::{Rng, SeedableRng};
use shoal_engine::tasks::{self, TaskCounts};
use shoal_engine::{Cluster, EngineConfig, OpResult, Pid, Worker};
use shoal_tests::{check_stamp, engine, read_counting_torn, stamp, stamped_pages};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

const FRAMES: usize = 512;
const PAGES: usize = FRAMES * 8;
const THREADS: usize = 2;
const TASKS: usize = 16;
const OPS_PER_TASK: usize = 1_500;

/// Run `f` on its own thread; fail if it takes longer than `limit` (a stall).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("stalled: not done after {limit:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the test thread panicked"),
    }
}

/// One task's operations: increments of a random page's stamp, taken while holding a shared
/// guard on another page (a task holding a guard may not pause, and must not wait for a
/// frame a paused task of its thread is loading), and validated optimistic reads.
fn task_ops(w: &Worker, pids: &[Pid], updates: &[AtomicU64], torn: &AtomicU64, seed: u64) {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    for _ in 0..OPS_PER_TASK {
        let i = rng.random_range(0..pids.len());
        let pid = pids[i];
        if rng.random_bool(0.3) {
            let other = pids[rng.random_range(0..pids.len())];
            w.run(|w| -> OpResult<()> {
                let held = (other != pid).then(|| w.shared(other)).transpose()?;
                let mut g = w.exclusive(pid)?;
                let v = check_stamp(g.data(), pid)
                    .unwrap_or_else(|m| panic!("writer saw a bad page: {m}"));
                stamp(&mut g.page_mut(), pid, v + 1);
                drop(held);
                Ok(())
            })
            .unwrap();
            updates[i].fetch_add(1, Ordering::Relaxed);
        } else {
            read_counting_torn(w, pid, torn);
        }
        tasks::yield_now();
    }
}

/// No reader accepted a torn page, and every page's stamp counts exactly the increments made.
fn no_torn_page_and_no_lost_update(
    w: &Worker,
    pids: &[Pid],
    updates: &[AtomicU64],
    torn: &AtomicU64,
) {
    assert_eq!(torn.load(Ordering::Relaxed), 0, "a torn page was accepted");
    for (i, &pid) in pids.iter().enumerate() {
        let v = w
            .run(|w| -> OpResult<u64> {
                let g = w.shared(pid)?;
                Ok(check_stamp(g.data(), pid).unwrap_or_else(|m| panic!("{m}")))
            })
            .unwrap();
        assert_eq!(v, updates[i].load(Ordering::Relaxed), "page {pid}");
    }
}

#[test]
fn tasks_on_a_page_set_eight_times_the_cache_lose_no_update() {
    let dir = tempfile::tempdir().unwrap();
    let e = std::sync::Arc::new(engine(dir.path(), FRAMES));
    let pids: Vec<Pid> = stamped_pages(&e.worker(), PAGES);
    let pids = std::sync::Arc::new(pids);
    let updates: std::sync::Arc<Vec<AtomicU64>> =
        std::sync::Arc::new((0..PAGES).map(|_| AtomicU64::new(0)).collect());
    let torn = std::sync::Arc::new(AtomicU64::new(0));
    let reads_before = e.stats().store_reads;
    let counts: Vec<TaskCounts> = {
        let (e, pids, updates, torn) = (e.clone(), pids.clone(), updates.clone(), torn.clone());
        within(Duration::from_secs(120), move || {
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..THREADS)
                    .map(|t| {
                        let (e, pids, updates, torn) = (&e, &pids, &updates, &torn);
                        s.spawn(move || {
                            tasks::run(TASKS, |k| {
                                let w = e.worker();
                                task_ops(&w, pids, updates, torn, (t * TASKS + k) as u64);
                            })
                            .unwrap()
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            })
        })
    };
    no_torn_page_and_no_lost_update(&e.worker(), &pids, &updates, &torn);
    // the tasks did read from the store, and did so by pausing (reads overlapped)
    assert!(e.stats().store_reads - reads_before > 1_000);
    let io_pauses: u64 = counts.iter().map(|c| c.io_pauses).sum();
    assert!(
        io_pauses > 1_000,
        "tasks paused for reads only {io_pauses} times"
    );
    // and nothing was left in flight on this thread
    assert_eq!(shoal_storage::io::in_flight(), 0);
}

#[test]
fn tasks_on_a_two_node_cluster_lose_no_update() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let c = std::sync::Arc::new(
        Cluster::mem(2, Duration::from_secs(20), move |i| {
            let mut c = EngineConfig::for_cluster_node(d.join(format!("n{i}")), FRAMES * 4096);
            c.free_target_percent = 10;
            c
        })
        .expect("cluster opens"),
    );
    // pages homed on both nodes, more than one node's cache
    let pids: Vec<Pid> = (0..2)
        .flat_map(|n| stamped_pages(&c.node(n).worker(), FRAMES))
        .collect();
    let pids = std::sync::Arc::new(pids);
    let updates: std::sync::Arc<Vec<AtomicU64>> =
        std::sync::Arc::new((0..pids.len()).map(|_| AtomicU64::new(0)).collect());
    let torn = std::sync::Arc::new(AtomicU64::new(0));
    {
        let (c, pids, updates, torn) = (c.clone(), pids.clone(), updates.clone(), torn.clone());
        within(Duration::from_secs(180), move || {
            std::thread::scope(|s| {
                for n in 0..2 {
                    let (c, pids, updates, torn) = (&c, &pids, &updates, &torn);
                    s.spawn(move || {
                        tasks::run(8, |k| {
                            let w = c.node(n).worker();
                            task_ops(&w, pids, updates, torn, 1000 + (n * 8 + k) as u64);
                        })
                        .unwrap()
                    });
                }
            })
        });
    }
    no_torn_page_and_no_lost_update(&c.node(0).worker(), &pids, &updates, &torn);
    let remote: u64 = c.nodes().iter().map(|e| e.protocol_stats().requests).sum();
    assert!(
        remote > 100,
        "only {remote} remote requests: the tasks never missed"
    );
}
