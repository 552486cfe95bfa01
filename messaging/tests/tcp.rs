//! The `tcp` transport on loopback: round trips and page pushes in a 3-node cluster; garbage,
//! malformed and truncated input refused without harm; a killed peer process makes requests
//! fail in bounded time.

mod common;

use shoal_messaging::{Echo, Layout, Mailboxes, MsgError, Transport, WaitMode};
use shoal_messaging::{TcpConfig, TcpTransport};
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LAYOUT: Layout = Layout {
    nodes: 3,
    workers: 2,
    handlers: 2,
    frames: 2,
};
const CLUSTER: u64 = 0x5EA1;

fn listeners(n: usize) -> (Vec<TcpListener>, Vec<SocketAddr>) {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    (ls, addrs)
}

fn cfg(node: u8, addrs: &[SocketAddr]) -> TcpConfig {
    let mut c = TcpConfig::new(node, CLUSTER, addrs.to_vec());
    c.connect_timeout = Duration::from_secs(10);
    c
}

fn start_cluster(layout: Layout) -> (Vec<Arc<Mailboxes<TcpTransport>>>, Vec<SocketAddr>) {
    let (ls, addrs) = listeners(layout.nodes as usize);
    let hs: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let c = cfg(i as u8, &addrs);
            std::thread::spawn(move || {
                TcpTransport::start(c, l, Arc::new(layout.region().unwrap())).unwrap()
            })
        })
        .collect();
    let mbs = hs
        .into_iter()
        .map(|h| Arc::new(Mailboxes::new(h.join().unwrap(), layout, WaitMode::Park).unwrap()))
        .collect();
    (mbs, addrs)
}

fn ping(mb: &Mailboxes<TcpTransport>, w: u16, peer: u8, n: u64) -> Result<(), MsgError> {
    let mut data = [0u8; 46];
    data[..8].copy_from_slice(&n.to_le_bytes());
    let r = mb.call(
        w,
        peer,
        &Echo::Ping { n, len: 8, data },
        Duration::from_secs(10),
    )?;
    assert_eq!(r.decode::<Echo>().unwrap(), Echo::Pong { n, len: 8, data });
    Ok(())
}

fn with_handlers<R>(mbs: &[Arc<Mailboxes<TcpTransport>>], f: impl FnOnce() -> R) -> R {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for (i, mb) in mbs.iter().enumerate() {
            for h in 0..mb.layout().handlers {
                let (mb, stop) = (Arc::clone(mb), &stop);
                s.spawn(move || mb.run_handler(h, stop, |env, r| common::serve(i as u8, env, r)));
            }
        }
        let r = f();
        stop.store(true, Ordering::Release);
        for mb in mbs {
            mb.wake_handlers();
        }
        r
    })
}

#[test]
fn three_nodes_round_trips_and_page_pushes() {
    let (mbs, _) = start_cluster(LAYOUT);
    with_handlers(&mbs, || {
        std::thread::scope(|s| {
            for (i, mb) in mbs.iter().enumerate() {
                for w in 0..LAYOUT.workers {
                    let mb = Arc::clone(mb);
                    s.spawn(move || {
                        for n in 0..500u64 {
                            let peer = ((i as u64 + n) % 3) as u8;
                            ping(&mb, w, peer, n).unwrap();
                            if n % 5 == 0 {
                                common::fetch_and_verify(&mb, w, peer, n, w as u32);
                            }
                        }
                    });
                }
            }
        });
    });
}

/// Expect the server to close `s` (EOF or reset) within a few seconds.
fn expect_closed(mut s: TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 64];
    let t0 = Instant::now();
    loop {
        match s.read(&mut b) {
            Ok(0) | Err(_) => return,
            Ok(_) => assert!(
                t0.elapsed() < Duration::from_secs(5),
                "connection not closed"
            ),
        }
    }
}

#[test]
fn garbage_at_the_listener_is_refused_and_the_node_keeps_working() {
    let layout = Layout { nodes: 2, ..LAYOUT };
    let (mbs, addrs) = start_cluster(layout);
    // random bytes at a running node's listener
    let mut s = TcpStream::connect(addrs[1]).unwrap();
    let junk: Vec<u8> = (0..1000u32).map(|i| (i * 7919 % 251) as u8).collect();
    let _ = s.write_all(&junk);
    expect_closed(s);
    // a well-formed hello for the wrong cluster
    let mut s = TcpStream::connect(addrs[0]).unwrap();
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(b"SHLM");
    h[4] = 1;
    h[6] = 1;
    h[8] = 0x99;
    let _ = s.write_all(&h);
    expect_closed(s);
    // the cluster is unharmed
    with_handlers(&mbs, || {
        for n in 0..50 {
            ping(&mbs[0], 0, 1, n).unwrap();
            ping(&mbs[1], 1, 0, n).unwrap();
        }
    });
}

/// Connect to node 1 of a 2-node cluster at `addr` (retrying until it listens) and do the
/// handshake as node 0 with `secret`.
fn dial_as_node_0(addr: SocketAddr, secret: &[u8]) -> (TcpStream, Result<(), String>) {
    let mut s = loop {
        if let Ok(s) = TcpStream::connect(addr) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let r = shoal_messaging::dial_handshake(&mut s, CLUSTER, 0, 1, 2, secret);
    (s, r)
}

/// Act as node 0 towards a real node 1: handshake, then send `bad` bytes.
fn fake_peer_sends(bad: &[u8]) {
    let (ls, addrs) = listeners(2);
    let mut ls = ls.into_iter();
    let _l0 = ls.next().unwrap();
    let l1 = ls.next().unwrap();
    let layout = Layout { nodes: 2, ..LAYOUT };
    let c = cfg(1, &addrs);
    let node1 =
        std::thread::spawn(move || TcpTransport::start(c, l1, Arc::new(layout.region().unwrap())));
    let (mut s, r) = dial_as_node_0(addrs[1], &[]);
    r.expect("handshake as node 0");
    let t1 = node1.join().unwrap().expect("node 1 started");
    assert!(t1.peer_alive(0));
    let _ = s.write_all(bad);
    let _ = s.shutdown(std::net::Shutdown::Write);
    expect_closed(s);
    let t0 = Instant::now();
    while t1.peer_alive(0) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "bad peer not dropped"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // node 1's region was not touched out of bounds (we would have crashed), and it refuses
    // further writes to the dead peer cleanly
    assert_eq!(
        t1.write(0, 0, &[0u8; 64]).unwrap_err(),
        MsgError::PeerDead(0)
    );
}

#[test]
fn out_of_bounds_frame_drops_the_peer() {
    let mut f = Vec::new();
    f.extend_from_slice(&(1u64 << 40).to_le_bytes()); // offset far outside the region
    f.extend_from_slice(&64u32.to_le_bytes());
    f.extend_from_slice(&[0u8; 4]);
    f.extend_from_slice(&[0xAB; 64]);
    fake_peer_sends(&f);
}

#[test]
fn oversized_and_misaligned_frames_drop_the_peer() {
    let mut f = Vec::new();
    f.extend_from_slice(&0u64.to_le_bytes());
    f.extend_from_slice(&u32::MAX.to_le_bytes());
    f.extend_from_slice(&[0u8; 4]);
    fake_peer_sends(&f);
    let mut f = Vec::new();
    f.extend_from_slice(&3u64.to_le_bytes());
    f.extend_from_slice(&8u32.to_le_bytes());
    f.extend_from_slice(&[0u8; 12]);
    fake_peer_sends(&f);
}

#[test]
fn truncated_frame_drops_the_peer() {
    let mut f = Vec::new();
    f.extend_from_slice(&0u64.to_le_bytes());
    f.extend_from_slice(&4096u32.to_le_bytes());
    f.extend_from_slice(&[0u8; 4]);
    f.extend_from_slice(&[1u8; 100]); // then EOF
    fake_peer_sends(&f);
}

#[test]
fn killed_peer_process_fails_requests_in_bounded_time() {
    let layout = Layout {
        nodes: 2,
        workers: 2,
        handlers: 1,
        frames: 2,
    };
    let l0 = TcpListener::bind("127.0.0.1:0").unwrap();
    let a0 = l0.local_addr().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shoal-echo-peer"))
        .arg(a0.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let a1: SocketAddr = {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the peer exited early"
        );
        line.strip_prefix("PEER_ADDR ")
            .unwrap_or_else(|| panic!("the peer said {line:?}"))
            .trim()
            .parse()
            .unwrap()
    };
    let t = TcpTransport::start(cfg(0, &[a0, a1]), l0, Arc::new(layout.region().unwrap())).unwrap();
    let mb = Arc::new(Mailboxes::new(t, layout, WaitMode::Park).unwrap());
    ping(&mb, 0, 1, 1).unwrap();
    // a request in flight when the peer dies, from another worker. Each ping has a 10 s
    // timeout, so a death that went unnoticed shows as `Timeout`, not `PeerDead`; the channel's
    // 60 s guard turns a hang into a failure (no wall-clock assertion: the machine may be
    // loaded).
    let (done, errs) = std::sync::mpsc::channel();
    {
        let mb = Arc::clone(&mb);
        std::thread::spawn(move || {
            for n in 0..1_000_000u64 {
                if let Err(e) = ping(&mb, 1, 1, n) {
                    let _ = done.send(Some(e));
                    return;
                }
            }
            let _ = done.send(None);
        });
    }
    std::thread::sleep(Duration::from_millis(200));
    child.kill().unwrap();
    let killed = Instant::now();
    child.wait().unwrap();
    let err = errs
        .recv_timeout(Duration::from_secs(60))
        .expect("hang guard: the in-flight request neither failed nor finished in 60 s");
    assert_eq!(
        err,
        Some(MsgError::PeerDead(1)),
        "the in-flight request fails"
    );
    eprintln!("death noticed after {:?}", killed.elapsed());
    assert_eq!(
        ping(&mb, 0, 1, 2).unwrap_err(),
        MsgError::PeerDead(1),
        "new requests fail at once"
    );
}

/// Issue 29: strangers that connect to a node's port while the cluster forms and then say
/// nothing must not keep the real peers out (each hello is read on a thread of its own, for
/// at most 2 s). Before, the acceptor read one connection at a time for up to 5 s each, and
/// ten idle connections made both nodes fail their 20 s connect timeout. The nodes here must
/// form within their 10 s connect timeout (else `start` fails).
#[test]
fn fifty_idle_connections_do_not_stop_a_cluster_forming() {
    let layout = Layout { nodes: 2, ..LAYOUT };
    let (ls, addrs) = listeners(2);
    // node 1 accepts node 0; fifty strangers get to its port first and stay silent
    let idle: Vec<TcpStream> = (0..50)
        .map(|_| TcpStream::connect(addrs[1]).expect("connect"))
        .collect();
    let t0 = Instant::now();
    let hs: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let c = cfg(i as u8, &addrs);
            std::thread::spawn(move || {
                TcpTransport::start(c, l, Arc::new(layout.region().unwrap()))
            })
        })
        .collect();
    let nodes: Vec<_> = hs
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap()
                .expect("the node starts despite the idle connections")
        })
        .collect();
    eprintln!(
        "cluster formed in {:?} beside 50 idle connections",
        t0.elapsed()
    );
    assert!(nodes.iter().all(|t| t.peer_alive(0) && t.peer_alive(1)));
    drop(idle);
}

/// Issue 29: a process that knows the cluster id but not the secret, connecting first and
/// claiming to be node 0, is refused (its handshake fails with "bad credentials" on both
/// sides), and the real node 0 then joins; a dialer with the wrong secret learns that the
/// other side could not prove the secret either.
#[test]
fn an_impostor_without_the_secret_is_refused_and_the_real_node_joins() {
    let layout = Layout { nodes: 2, ..LAYOUT };
    let (ls, addrs) = listeners(2);
    let mut ls = ls.into_iter();
    let (l0, l1) = (ls.next().unwrap(), ls.next().unwrap());
    let with_secret = |node: u8, secret: &[u8]| {
        let mut c = cfg(node, &addrs);
        c.secret = secret.to_vec();
        c
    };
    let c1 = with_secret(1, b"the real secret");
    let node1 =
        std::thread::spawn(move || TcpTransport::start(c1, l1, Arc::new(layout.region().unwrap())));
    // the impostor: right cluster id, claims node 0, wrong secret
    let (s, r) = dial_as_node_0(addrs[1], b"a guess");
    let e = r.expect_err("the impostor gets in");
    assert!(e.contains("bad credentials"), "{e}");
    drop(s);
    // the real node 0 joins
    let c0 = with_secret(0, b"the real secret");
    let t0 = TcpTransport::start(c0, l0, Arc::new(layout.region().unwrap()))
        .expect("the real node 0 joins after the impostor");
    let t1 = node1.join().unwrap().expect("node 1 starts");
    assert!(t0.peer_alive(1) && t1.peer_alive(0));
}

/// A relay between node 0 and node 1's listener: copies bytes both ways, keeps what node 0
/// sent, and (when `flip_after` is set) flips one bit of node 0's stream at that byte.
fn relay(to: SocketAddr, flip_after: Option<usize>) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = Arc::clone(&seen);
    std::thread::spawn(move || {
        let (a, _) = l.accept().unwrap();
        let b = TcpStream::connect(to).unwrap();
        let (mut a2, mut b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut b2, &mut a2);
            let _ = a2.shutdown(std::net::Shutdown::Write);
        });
        let (mut a, mut b) = (a, b);
        let mut buf = [0u8; 4096];
        loop {
            let n = match a.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut seen = seen2.lock().unwrap();
            let start = seen.len();
            seen.extend_from_slice(&buf[..n]);
            if let Some(f) = flip_after {
                if (start..start + n).contains(&f) {
                    buf[f - start] ^= 0x10;
                }
            }
            drop(seen);
            if b.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = b.shutdown(std::net::Shutdown::Write);
    });
    (at, seen)
}

/// Start an encrypted 2-node cluster whose node 0 reaches node 1 through [`relay`].
fn sealed_pair(
    flip_after: Option<usize>,
) -> (Arc<TcpTransport>, Arc<TcpTransport>, Arc<Mutex<Vec<u8>>>) {
    pair_through_relay(flip_after, true)
}

/// Start a 2-node cluster (frames sealed or not) whose node 0 reaches node 1 through
/// [`relay`].
fn pair_through_relay(
    flip_after: Option<usize>,
    encrypt: bool,
) -> (Arc<TcpTransport>, Arc<TcpTransport>, Arc<Mutex<Vec<u8>>>) {
    let layout = Layout { nodes: 2, ..LAYOUT };
    let (ls, addrs) = listeners(2);
    let mut ls = ls.into_iter();
    let (l0, l1) = (ls.next().unwrap(), ls.next().unwrap());
    let (via, seen) = relay(addrs[1], flip_after);
    let sealed = |node: u8, addrs: &[SocketAddr]| {
        let mut c = cfg(node, addrs);
        c.secret = b"a secret for sealed frames......".to_vec();
        c.encrypt = encrypt;
        c
    };
    let c1 = sealed(1, &addrs);
    let node1 =
        std::thread::spawn(move || TcpTransport::start(c1, l1, Arc::new(layout.region().unwrap())));
    let c0 = sealed(0, &[addrs[0], via]);
    let t0 = TcpTransport::start(c0, l0, Arc::new(layout.region().unwrap())).unwrap();
    let t1 = node1.join().unwrap().unwrap();
    (t0, t1, seen)
}

/// Issue 29: with `encrypt`, pages and messages cross the wire sealed: they arrive intact,
/// no run of their bytes is visible on the wire, and a flipped bit on the way drops the peer
/// before the frame is applied.
#[test]
fn sealed_frames_arrive_intact_hide_their_bytes_and_fail_when_altered() {
    let (t0, t1, seen) = sealed_pair(None);
    let pattern: Vec<u8> = b"PAGE-BYTES-IN-CLEAR!"
        .iter()
        .cycle()
        .take(4096)
        .copied()
        .collect();
    let mut got = vec![0u8; 4096];
    for round in 0..20 {
        t0.write(1, 4096, &pattern).unwrap();
        t1.write(0, 8192, &pattern).unwrap();
        let t = Instant::now();
        loop {
            t1.region().read(4096, &mut got).unwrap();
            if got == pattern {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "round {round}: not delivered"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        got.fill(0);
        t1.region().store(4096, 0); // the next round must deliver again
    }
    let wire = seen.lock().unwrap().clone();
    assert!(wire.len() > 20 * 4096, "{} bytes relayed", wire.len());
    assert!(
        !wire.windows(8).any(|w| w == &pattern[..8]),
        "page bytes visible on the wire"
    );
    drop((t0, t1));

    // one flipped bit well after the handshake: node 1 drops node 0, the frame is not applied
    let (t0, t1, seen) = sealed_pair(Some(2000));
    let marker = vec![0xA5u8; 1024];
    let t = Instant::now();
    while seen.lock().unwrap().len() <= 2000 {
        // (an error here means node 1 already dropped node 0: what the test waits for)
        let _ = t0.write(1, 4096, &marker);
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "relay saw too little"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let t = Instant::now();
    while t1.peer_alive(0) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "altered frame not detected"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop((t0, t1));
}

/// Issue 46: `write_two` (a page and the message that announces it) lands both writes, in
/// order, plain and sealed; each is its own frame on the wire.
#[test]
fn two_writes_sent_at_once_land_in_order_plain_and_sealed() {
    for encrypt in [false, true] {
        let (t0, t1, _seen) = pair_through_relay(None, encrypt);
        let mut got = vec![0u8; 4096];
        for round in 1..=20u64 {
            let page = vec![round as u8; 4096];
            t0.write_two(1, (4096, &page), (8192, &round.to_le_bytes()))
                .unwrap();
            let t = Instant::now();
            // the second write seen means the first one landed before it
            while t1.region().load(8192) != round {
                assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "encrypt {encrypt}, round {round}: not delivered"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            t1.region().read(4096, &mut got).unwrap();
            assert_eq!(got, page, "encrypt {encrypt}, round {round}");
        }
        // a misaligned second write fails before anything is sent: a write after it lands,
        // the first write of the pair never does, and the peer stays
        assert!(t0
            .write_two(1, (4096, &[0xEE; 4096]), (8193, &[0u8; 8]))
            .is_err());
        t0.write(1, 8192, &21u64.to_le_bytes()).unwrap();
        let t = Instant::now();
        while t1.region().load(8192) != 21 {
            assert!(t.elapsed() < Duration::from_secs(5), "encrypt {encrypt}");
            std::thread::sleep(Duration::from_millis(1));
        }
        t1.region().read(4096, &mut got).unwrap();
        assert_eq!(
            got,
            vec![20u8; 4096],
            "encrypt {encrypt}: half a pair landed"
        );
        assert!(t1.peer_alive(0));
        drop((t0, t1));
    }
}

/// Issue 29: a node that encrypts and one that does not refuse each other, and the dialer's
/// error says why.
#[test]
fn an_encrypting_node_and_a_plain_one_refuse_each_other() {
    let layout = Layout { nodes: 2, ..LAYOUT };
    let (ls, addrs) = listeners(2);
    let mut ls = ls.into_iter();
    let (l0, l1) = (ls.next().unwrap(), ls.next().unwrap());
    let secret = b"a secret for sealed frames......".to_vec();
    let c1 = {
        let mut c = cfg(1, &addrs);
        c.secret = secret.clone();
        c.encrypt = true;
        c.connect_timeout = Duration::from_secs(3);
        c
    };
    let node1 =
        std::thread::spawn(move || TcpTransport::start(c1, l1, Arc::new(layout.region().unwrap())));
    let c0 = {
        let mut c = cfg(0, &addrs);
        c.secret = secret.clone();
        c.connect_timeout = Duration::from_secs(3);
        c
    };
    let e = TcpTransport::start(c0, l0, Arc::new(layout.region().unwrap()))
        .err()
        .expect("a plain node joined an encrypting one");
    assert!(e.to_string().contains("encryption setting"), "{e}");
    assert!(node1.join().unwrap().is_err());
    // and encryption without a secret is a configuration error, before any traffic
    let (ls, addrs) = listeners(1);
    let c = {
        let mut c = cfg(0, &addrs);
        c.encrypt = true;
        c
    };
    let e = TcpTransport::start(
        c,
        ls.into_iter().next().unwrap(),
        Arc::new(layout.region().unwrap()),
    )
    .err()
    .expect("encryption without a secret");
    assert!(e.to_string().contains("secret"), "{e}");
}

/// Issue 29: a handshake recorded on the wire and replayed to a node does not get in: the node
/// answers with a fresh nonce, so the recorded proof does not verify, and the connection is
/// closed without the welcome byte; the real node 0 then joins.
#[test]
fn a_replayed_handshake_is_refused() {
    let layout = Layout { nodes: 2, ..LAYOUT };
    let secret = b"a secret the attacker never sees".to_vec();
    let with_secret = |node: u8, addrs: &[SocketAddr]| {
        let mut c = cfg(node, addrs);
        c.secret = secret.clone();
        c
    };
    // a real handshake, recorded by a relay on the path
    let (ls, addrs) = listeners(2);
    let mut ls = ls.into_iter();
    let (l0, l1) = (ls.next().unwrap(), ls.next().unwrap());
    let (via, seen) = relay(addrs[1], None);
    let c1 = with_secret(1, &addrs);
    let node1 =
        std::thread::spawn(move || TcpTransport::start(c1, l1, Arc::new(layout.region().unwrap())));
    let t0 = TcpTransport::start(
        with_secret(0, &[addrs[0], via]),
        l0,
        Arc::new(layout.region().unwrap()),
    )
    .unwrap();
    let t1 = node1.join().unwrap().unwrap();
    drop((t0, t1));
    // the dialer's side: hello 32 + nonce 16, then its proof 32
    let recorded: Vec<u8> = seen.lock().unwrap()[..80].to_vec();

    // replay it to a node 1 of the same cluster and secret
    let (ls, addrs) = listeners(2);
    let mut ls = ls.into_iter();
    let (l0, l1) = (ls.next().unwrap(), ls.next().unwrap());
    let c1 = with_secret(1, &addrs);
    let node1 =
        std::thread::spawn(move || TcpTransport::start(c1, l1, Arc::new(layout.region().unwrap())));
    let mut s = TcpStream::connect(addrs[1]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&recorded[..48]).unwrap();
    let mut answer = [0u8; 32 + 16 + 32];
    s.read_exact(&mut answer).unwrap();
    s.write_all(&recorded[48..80]).unwrap();
    let mut welcome = [0u8; 1];
    match s.read(&mut welcome) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("a replayed handshake got an answer: {other:?}"),
    }
    // and the real node 0 joins
    let t0 = TcpTransport::start(
        with_secret(0, &addrs),
        l0,
        Arc::new(layout.region().unwrap()),
    )
    .expect("node 0 joins after the replay");
    let t1 = node1.join().unwrap().unwrap();
    assert!(t0.peer_alive(1) && t1.peer_alive(0));
}

/// Issue 46: a receiver thread runs its node's service once it applied what arrived, and the
/// service's sends never wait for credit, which only that same thread could land. Node 1 has
/// no handler thread: its receiver alone answers every message with three pages, more than
/// node 0's rings take (2 messages, 1 page), so most answers wait in node 1's backlog until
/// node 0's credit comes back through the receiver that is running the service.
#[test]
fn a_receiver_thread_answers_through_its_nodes_service_without_waiting_for_credit() {
    receiver_answers(false);
    receiver_answers(true);
}

/// The test above with plain or sealed frames.
fn receiver_answers(encrypt: bool) {
    use shoal_messaging::{ChannelLayout, Channels, PAGE_BYTES};
    let l = ChannelLayout {
        nodes: 2,
        ring: 2,
        pages: 1,
    };
    let (ls, addrs) = listeners(2);
    let starts: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(i, lis)| {
            let mut c = cfg(i as u8, &addrs);
            if encrypt {
                c.secret = b"s3cret".to_vec();
                c.encrypt = true;
            }
            std::thread::spawn(move || {
                TcpTransport::start(c, lis, Arc::new(l.region().unwrap())).unwrap()
            })
        })
        .collect();
    let mut ts = starts.into_iter().map(|h| h.join().unwrap());
    let (t0, t1) = (ts.next().unwrap(), ts.next().unwrap());
    let a = Channels::new(t0, l, WaitMode::Park).unwrap();
    let b = Arc::new(Channels::new(t1.clone(), l, WaitMode::Park).unwrap());
    let served_on = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
    let (weak, seen) = (Arc::downgrade(&b), Arc::clone(&served_on));
    t1.region().set_service(Box::new(move || {
        let Some(b) = weak.upgrade() else {
            return false;
        };
        let mut worked = false;
        while let Some(m) = b.try_recv() {
            worked = true;
            let n = m.env.body[0];
            for k in 0..3u8 {
                let mut e = m.env;
                e.body[1] = k;
                b.send(0, e, Some(&[n.wrapping_add(k); PAGE_BYTES]))
                    .unwrap();
            }
        }
        let name = std::thread::current().name().unwrap_or("").to_string();
        seen.lock().unwrap().insert(name);
        worked
    }));
    let mut got = Vec::new();
    let hang = common::HangGuard::start();
    for n in 0..50u8 {
        a.send(1, common::numbered(n), None).unwrap();
        // node 0 takes what came back meanwhile (its handler's job)
        while let Some(m) = a.try_recv() {
            got.push((m.env.body[0], m.env.body[1], m.page.map(|p| p[100])));
        }
    }
    while got.len() < 150 {
        hang.check(|| {
            format!(
                "encrypt {encrypt}: only {} of 150 answers came back",
                got.len()
            )
        });
        match a.try_recv() {
            Some(m) => got.push((m.env.body[0], m.env.body[1], m.page.map(|p| p[100]))),
            None => a.wait(Duration::from_millis(1), &AtomicBool::new(false)),
        }
    }
    let want: Vec<_> = (0..50u8)
        .flat_map(|n| (0..3u8).map(move |k| (n, k, Some(n.wrapping_add(k)))))
        .collect();
    assert_eq!(
        got, want,
        "encrypt {encrypt}: every answer, in order, with its page"
    );
    assert!(a.peer_alive(1) && b.peer_alive(0), "nobody was given up on");
    assert_eq!(
        *served_on.lock().unwrap(),
        ["shoal-tcp-rx-1-0".to_string()].into(),
        "node 1's service ran on its receiver thread only"
    );
}

/// Nodes whose layers above send messages of different versions (two builds of Shoal) refuse
/// each other at the handshake, with an error naming both versions.
#[test]
fn nodes_whose_messages_differ_in_version_refuse_each_other() {
    let layout = Layout { nodes: 2, ..LAYOUT };
    let (ls, addrs) = listeners(2);
    let mut ls = ls.into_iter();
    let (l0, l1) = (ls.next().unwrap(), ls.next().unwrap());
    let mut c1 = cfg(1, &addrs);
    c1.messages_version = 2;
    c1.connect_timeout = Duration::from_secs(3);
    let node1 =
        std::thread::spawn(move || TcpTransport::start(c1, l1, Arc::new(layout.region().unwrap())));
    let mut c0 = cfg(0, &addrs);
    c0.messages_version = 1;
    let r0 = TcpTransport::start(c0, l0, Arc::new(layout.region().unwrap()));
    match r0 {
        Err(MsgError::Handshake { why, .. }) => assert!(
            why.contains("messages of version 2, this node's are of version 1"),
            "{why}"
        ),
        Err(e) => panic!("refused, but with {e}"),
        Ok(_) => panic!("nodes of two message versions paired up"),
    }
    assert!(
        node1.join().unwrap().is_err(),
        "node 1 did not pair up either"
    );
}
