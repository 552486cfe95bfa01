//! The `mem` transport: round trips with many workers and several handlers per node, page
//! payload integrity, and a peer that dies.

mod common;

use shoal_messaging::{mem_cluster, Echo, Layout, Mailboxes, MemTransport, MsgError, WaitMode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn cluster(layout: Layout, mode: WaitMode) -> Vec<Arc<Mailboxes<MemTransport>>> {
    let regions = (0..layout.nodes)
        .map(|_| layout.region().unwrap())
        .collect();
    mem_cluster(regions)
        .unwrap()
        .into_iter()
        .map(|t| Arc::new(Mailboxes::new(t, layout, mode).unwrap()))
        .collect()
}

fn exercise(mode: WaitMode, rounds: u64) {
    let layout = Layout {
        nodes: 3,
        workers: 4,
        handlers: 2,
        frames: 4,
    };
    let nodes = cluster(layout, mode);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for (i, mb) in nodes.iter().enumerate() {
            for h in 0..layout.handlers {
                let (mb, stop) = (Arc::clone(mb), &stop);
                s.spawn(move || {
                    mb.run_handler(h, stop, |env, r| common::serve(i as u8, env, r));
                });
            }
        }
        let mut clients = Vec::new();
        for (i, mb) in nodes.iter().enumerate() {
            for w in 0..layout.workers {
                let mb = Arc::clone(mb);
                clients.push(s.spawn(move || {
                    for n in 0..rounds {
                        let peer = ((i as u64 + n) % 3) as u8;
                        let mut data = [0u8; 46];
                        data[..8].copy_from_slice(&(n * 31 + w as u64).to_le_bytes());
                        let r = mb
                            .call(
                                w,
                                peer,
                                &Echo::Ping { n, len: 8, data },
                                Duration::from_secs(10),
                            )
                            .unwrap();
                        assert_eq!(r.decode::<Echo>().unwrap(), Echo::Pong { n, len: 8, data });
                        assert_eq!(r.from_node, peer);
                        if n % 10 == 0 {
                            common::fetch_and_verify(&mb, w, peer, n, w as u32 % layout.frames);
                        }
                    }
                }));
            }
        }
        for c in clients {
            c.join().unwrap();
        }
        stop.store(true, Ordering::Release);
        for mb in &nodes {
            mb.wake_handlers();
        }
    });
}

#[test]
fn round_trips_and_pages_park_mode() {
    exercise(WaitMode::Park, 2_000);
}

#[test]
fn round_trips_and_pages_poll_mode() {
    exercise(WaitMode::Poll, 300);
}

#[test]
fn a_dead_peer_fails_requests_in_bounded_time() {
    let layout = Layout {
        nodes: 2,
        workers: 1,
        handlers: 1,
        frames: 1,
    };
    let nodes = cluster(layout, WaitMode::Park);
    // node 1 has no handler running: a request to it waits until node 1 is declared dead
    let t0 = std::time::Instant::now();
    let killer = {
        let t = Arc::clone(nodes[0].transport());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            t.kill(1);
        })
    };
    // bounded by the call's own 30 s timeout: had the death gone unnoticed, the error would be
    // `Timeout`, not `PeerDead` (no wall-clock assertion: the machine may be loaded)
    let r = nodes[0].call(0, 1, &Echo::Refused { code: 0 }, Duration::from_secs(30));
    assert_eq!(r.unwrap_err(), MsgError::PeerDead(1));
    eprintln!("death noticed after {:?}", t0.elapsed());
    killer.join().unwrap();
    // new requests fail at once
    assert_eq!(
        nodes[0]
            .call(0, 1, &Echo::Refused { code: 0 }, Duration::from_secs(30))
            .unwrap_err(),
        MsgError::PeerDead(1)
    );
}

#[test]
fn timeouts_and_late_replies_do_not_confuse_the_next_call() {
    let layout = Layout {
        nodes: 2,
        workers: 1,
        handlers: 1,
        frames: 1,
    };
    let nodes = cluster(layout, WaitMode::Park);
    let e = nodes[0].call(
        0,
        1,
        &Echo::FetchPage { page: 1, frame: 0 },
        Duration::from_millis(50),
    );
    assert!(matches!(e, Err(MsgError::Timeout { peer: 1, .. })), "{e:?}");
    // the handler comes up late and answers the old request, then the new one
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let mb = Arc::clone(&nodes[1]);
        let stop = &stop;
        s.spawn(move || {
            mb.run_handler(0, stop, |env, r| common::serve(1, env, r));
        });
        let mut data = [0u8; 46];
        data[0] = 9;
        let r = nodes[0]
            .call(
                0,
                1,
                &Echo::Ping { n: 5, len: 1, data },
                Duration::from_secs(10),
            )
            .unwrap();
        assert_eq!(
            r.decode::<Echo>().unwrap(),
            Echo::Pong { n: 5, len: 1, data }
        );
        stop.store(true, Ordering::Release);
        nodes[1].wake_handlers();
    });
}
