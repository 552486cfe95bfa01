//! Messaging benchmarks (issue: messaging): 64-byte round trips and 4 KiB page pushes through
//! the mailboxes over `mem` and `tcp`, next to a plain TCP ping-pong of the same sizes on
//! loopback measured by the same harness; and messages per second through one handler thread.
//!
//! Run: `cargo bench -p shoal-benches --bench messaging` (SHOAL_BENCH_N round trips per point).

use hdrhistogram::Histogram;
use shoal_messaging::TcpTransport;
use shoal_messaging::{
    mem_cluster, Echo, Envelope, Layout, Mailboxes, Responder, Transport, WaitMode, PAGE_BYTES,
};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn serve<T: Transport>(
    env: &Envelope,
    r: &mut Responder<'_, T>,
    page: &[u8; PAGE_BYTES],
) -> Envelope {
    match env.decode::<Echo>() {
        Ok(Echo::Ping { n, len, data }) => Envelope::new(&Echo::Pong { n, len, data }, 0, 0, 0),
        Ok(Echo::FetchPage { page: p, frame }) => {
            r.push_page(frame, page).expect("push");
            Envelope::new(&Echo::PagePushed { page: p, frame }, 0, 0, 0)
        }
        _ => Envelope::new(&Echo::Refused { code: 1 }, 0, 0, 0),
    }
}

fn report(label: &str, h: &Histogram<u64>) {
    println!(
        "{label:<44} median {:>7.1} us   p99 {:>7.1} us   ({} samples)",
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.len()
    );
    println!(
        "{{\"bench\":\"{label}\",\"median_us\":{:.2},\"p99_us\":{:.2}}}",
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0
    );
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 10_000_000_000, 3).unwrap()
}

/// Round trips (ping) and page fetches from node 0 to node 1's handler.
fn mailbox_latency<T: Transport>(name: &str, mbs: [Arc<Mailboxes<T>>; 2], n: usize) {
    let stop = AtomicBool::new(false);
    let page = [7u8; PAGE_BYTES];
    std::thread::scope(|s| {
        let (server, stop_r, page_r) = (Arc::clone(&mbs[1]), &stop, &page);
        s.spawn(move || server.run_handler(0, stop_r, |env, r| serve(env, r, page_r)));
        let mb = &mbs[0];
        let data = [0u8; 46];
        let (mut ping, mut fetch) = (hist(), hist());
        for i in 0..n + n / 10 {
            let t = Instant::now();
            mb.call(
                0,
                1,
                &Echo::Ping {
                    n: i as u64,
                    len: 46,
                    data,
                },
                Duration::from_secs(10),
            )
            .unwrap();
            if i >= n / 10 {
                ping.record(t.elapsed().as_nanos() as u64).unwrap();
            }
            let t = Instant::now();
            mb.call(
                0,
                1,
                &Echo::FetchPage {
                    page: i as u64,
                    frame: 0,
                },
                Duration::from_secs(10),
            )
            .unwrap();
            if i >= n / 10 {
                fetch.record(t.elapsed().as_nanos() as u64).unwrap();
            }
        }
        report(&format!("{name}: 64 B round trip"), &ping);
        report(
            &format!("{name}: 4 KiB page push (64 B req, page + reply)"),
            &fetch,
        );
        stop.store(true, Ordering::Release);
        mbs[1].wake_handlers();
    });
}

/// Plain TCP on loopback: the same exchanges without Shoal's framing or mailboxes.
fn plain_tcp(n: usize) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut req = [0u8; 64];
        let mut resp = vec![0u8; PAGE_BYTES + 64];
        while s.read_exact(&mut req).is_ok() {
            let len = if req[0] == 1 { 64 } else { PAGE_BYTES + 64 };
            resp[..8].copy_from_slice(&req[..8]);
            if s.write_all(&resp[..len]).is_err() {
                break;
            }
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let (mut ping, mut fetch) = (hist(), hist());
    let mut req = [0u8; 64];
    let mut resp = vec![0u8; PAGE_BYTES + 64];
    for i in 0..n + n / 10 {
        for (kind, h, len) in [(1u8, &mut ping, 64), (2u8, &mut fetch, PAGE_BYTES + 64)] {
            req[0] = kind;
            let t = Instant::now();
            s.write_all(&req).unwrap();
            s.read_exact(&mut resp[..len]).unwrap();
            if i >= n / 10 {
                h.record(t.elapsed().as_nanos() as u64).unwrap();
            }
        }
    }
    drop(s);
    server.join().unwrap();
    report("plain tcp: 64 B ping-pong", &ping);
    report("plain tcp: 64 B request, 4160 B response", &fetch);
}

fn mem_pair(layout: Layout, mode: WaitMode) -> [Arc<Mailboxes<shoal_messaging::MemTransport>>; 2] {
    let ts = mem_cluster(vec![layout.region().unwrap(), layout.region().unwrap()]).unwrap();
    let mut it = ts
        .into_iter()
        .map(|t| Arc::new(Mailboxes::new(t, layout, mode).unwrap()));
    [it.next().unwrap(), it.next().unwrap()]
}

fn tcp_pair(layout: Layout, mode: WaitMode, encrypt: bool) -> [Arc<Mailboxes<TcpTransport>>; 2] {
    let mut it = shoal_benches::loopback_tcp(2, || layout.region().unwrap(), encrypt)
        .into_iter()
        .map(|t| Arc::new(Mailboxes::new(t, layout, mode).unwrap()));
    [it.next().unwrap(), it.next().unwrap()]
}

/// Messages per second through one handler thread: `workers` clients on node 0 pinging it.
fn handler_throughput(workers: u16, secs: u64) {
    let layout = Layout {
        nodes: 2,
        workers,
        handlers: 1,
        frames: 1,
    };
    let mbs = mem_pair(layout, WaitMode::Park);
    let stop = AtomicBool::new(false);
    let page = [0u8; PAGE_BYTES];
    let total: u64 = std::thread::scope(|s| {
        let (server, stop_r, page_r) = (Arc::clone(&mbs[1]), &stop, &page);
        s.spawn(move || server.run_handler(0, stop_r, |env, r| serve(env, r, page_r)));
        let t0 = Instant::now();
        let hs: Vec<_> = (0..workers)
            .map(|w| {
                let mb = Arc::clone(&mbs[0]);
                s.spawn(move || {
                    let mut n = 0u64;
                    while t0.elapsed() < Duration::from_secs(secs) {
                        mb.call(
                            w,
                            1,
                            &Echo::Ping {
                                n,
                                len: 0,
                                data: [0; 46],
                            },
                            Duration::from_secs(10),
                        )
                        .unwrap();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let total = hs.into_iter().map(|h| h.join().unwrap()).sum();
        stop.store(true, Ordering::Release);
        mbs[1].wake_handlers();
        total
    });
    let rate = total as f64 / secs as f64;
    println!("one handler thread, {workers} workers (mem): {rate:.0} requests/s");
    println!(
        "{{\"bench\":\"handler_throughput\",\"workers\":{workers},\"requests_per_s\":{rate:.0}}}"
    );
}

fn main() {
    let n: usize = std::env::var("SHOAL_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let layout = Layout {
        nodes: 2,
        workers: 1,
        handlers: 1,
        frames: 1,
    };
    mailbox_latency("mem (park)", mem_pair(layout, WaitMode::Park), n);
    mailbox_latency("mem (poll)", mem_pair(layout, WaitMode::Poll), n);
    // sealed frames (issue 29) next to plain ones, alternating
    for round in 1..=2 {
        for mode in [WaitMode::Park, WaitMode::Poll] {
            for sealed in [false, true] {
                let name = format!(
                    "tcp{} ({}) #{round}",
                    if sealed { " sealed" } else { "" },
                    if mode == WaitMode::Park {
                        "park"
                    } else {
                        "poll"
                    }
                );
                mailbox_latency(&name, tcp_pair(layout, mode, sealed), n);
            }
        }
    }
    plain_tcp(n);
    handler_throughput(1, 3);
    handler_throughput(8, 3);
}
