//! Concurrent writers and optimistic readers on a page set 8x larger than the cache, with the
//! provider evicting all the while. Every page must read back with exactly the number of
//! updates made to it, before and after a clean shutdown, and no reader may accept a torn page.

use rand::{Rng, SeedableRng};
use shoal_engine::{OpResult, Pid};
use shoal_tests::{check_stamp, engine, read_counting_torn, stamp, stamped_pages};
use std::sync::atomic::{AtomicU64, Ordering};

const FRAMES: usize = 512;
const PAGES: usize = FRAMES * 8;
const WRITERS: usize = 3;
const READERS: usize = 2;
const WRITES_PER_THREAD: usize = 12_000;
const READS_PER_THREAD: usize = 20_000;

#[test]
fn stamped_pages_survive_eviction_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path(), FRAMES);
    let pids: Vec<Pid> = stamped_pages(&e.worker(), PAGES);
    let updates: Vec<AtomicU64> = (0..PAGES).map(|_| AtomicU64::new(0)).collect();
    let torn_accepted = AtomicU64::new(0);

    std::thread::scope(|s| {
        for t in 0..WRITERS {
            let (e, pids, updates) = (&e, &pids, &updates);
            s.spawn(move || {
                let w = e.worker();
                let mut rng = rand::rngs::SmallRng::seed_from_u64(t as u64);
                for _ in 0..WRITES_PER_THREAD {
                    let i = rng.random_range(0..PAGES);
                    let pid = pids[i];
                    w.run(|w| -> OpResult<()> {
                        let mut g = w.exclusive(pid)?;
                        let v = check_stamp(g.data(), pid)
                            .unwrap_or_else(|m| panic!("writer saw a bad page: {m}"));
                        stamp(&mut g.page_mut(), pid, v + 1);
                        Ok(())
                    })
                    .unwrap();
                    updates[i].fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for t in 0..READERS {
            let (e, pids, torn) = (&e, &pids, &torn_accepted);
            s.spawn(move || {
                let w = e.worker();
                let mut rng = rand::rngs::SmallRng::seed_from_u64(100 + t as u64);
                for _ in 0..READS_PER_THREAD {
                    let pid = pids[rng.random_range(0..PAGES)];
                    // validated: the copy must be a whole, single version of this page
                    read_counting_torn(&w, pid, torn);
                }
            });
        }
    });

    assert_eq!(
        torn_accepted.load(Ordering::Relaxed),
        0,
        "a validated read was torn"
    );
    // (every read ends validated or the run fails: the reads are not counted against a total)
    let st = e.stats();
    assert!(
        st.evictions > PAGES as u64,
        "provider must evict constantly: {st:?}"
    );
    assert!(st.writebacks > 0 && st.faults > 0, "{st:?}");

    let verify = |e: &shoal_engine::Engine| {
        let w = e.worker();
        for (i, &pid) in pids.iter().enumerate() {
            let v = w
                .run(|w| {
                    let g = w.shared(pid)?;
                    check_stamp(g.data(), pid).map_err(|m| panic!("{m}"))
                })
                .map_err(|e: shoal_engine::EngineError| e)
                .unwrap();
            assert_eq!(
                v,
                updates[i].load(Ordering::Relaxed),
                "page {pid} lost updates"
            );
        }
    };
    verify(&e);
    e.close().unwrap();
    drop(e);

    let e = engine(dir.path(), FRAMES);
    verify(&e);
}
