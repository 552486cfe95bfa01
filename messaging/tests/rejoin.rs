//! A restarted node rejoins a running `tcp` cluster on loopback: the live nodes take its new
//! incarnation back, its streams start afresh both ways (what the old incarnation left in
//! rings and backlogs is dropped), and the incarnation they gave up on is refused. The same
//! for a node of a `mem` cluster revived in its process (`MemTransport::revive`).

mod common;

use shoal_messaging::{
    mem_cluster, ChannelLayout, Channels, MsgError, TcpConfig, TcpTransport, Transport, WaitMode,
    PAGE_BYTES,
};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

const CLUSTER: u64 = 0x4E70;
const LAYOUT: ChannelLayout = ChannelLayout {
    nodes: 3,
    ring: 4,
    pages: 2,
};

fn cfg(node: u8, addrs: &[SocketAddr], encrypt: bool, incarnation: u64) -> TcpConfig {
    let mut c = TcpConfig::new(node, CLUSTER, addrs.to_vec());
    c.connect_timeout = Duration::from_secs(10);
    c.incarnation = incarnation;
    if encrypt {
        c.secret = b"rejoin".to_vec();
        c.encrypt = true;
    }
    c
}

/// Bind `addr` again (a killed node's port is free once its listener closed).
fn bind_again(addr: SocketAddr) -> TcpListener {
    let hang = common::HangGuard::start();
    loop {
        match TcpListener::bind(addr) {
            Ok(l) => return l,
            Err(e) => hang.check(|| format!("binding {addr} again: {e}")),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Channels over `t`; the node takes restarted peers back (resetting its streams with them)
/// when `rejoins`.
fn channels(t: Arc<dyn Transport>, rejoins: bool) -> Arc<Channels> {
    let ch = Arc::new(Channels::new(t.clone(), LAYOUT, WaitMode::Park).unwrap());
    if rejoins {
        let w = Arc::downgrade(&ch);
        assert!(t.take_rejoins(Arc::new(move |peer| {
            if let Some(ch) = w.upgrade() {
                ch.reset_peer(peer);
            }
            Ok(())
        })));
    }
    ch
}

/// A message numbered `n` with a page of bytes `n` when `page`.
fn send(ch: &Channels, to: u8, n: u8, page: bool) -> Result<(), MsgError> {
    ch.send(to, common::numbered(n), page.then_some(&[n; PAGE_BYTES]))
}

/// Receive `count` messages on `ch` while `others` flush their backlogs (as their handlers
/// would): (from, number, page byte).
fn receive(ch: &Channels, others: &[&Channels], count: usize) -> Vec<(u8, u8, Option<u8>)> {
    let hang = common::HangGuard::start();
    let mut got = Vec::new();
    while got.len() < count {
        hang.check(|| format!("node {}: {} of {count} messages", ch.node(), got.len()));
        match ch.try_recv() {
            Some(m) => got.push((m.env.from_node, m.env.body[0], m.page.map(|p| p[7]))),
            None => {
                for o in others {
                    o.flush();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    got
}

/// Node 0 and node 2 exchange `count` messages (with pages on the even ones) with node 1,
/// both ways, more than the rings hold, and check every one arrived in order.
fn exchange(chs: &[&Channels; 3], first: u8, count: u8) {
    let want = |from: u8| -> Vec<(u8, u8, Option<u8>)> {
        (first..first + count)
            .map(|n| (from, n, (n % 2 == 0).then_some(n)))
            .collect()
    };
    for n in first..first + count {
        for (a, b) in [(0, 1), (2, 1), (1, 0), (1, 2)] {
            send(chs[a], b as u8, n, n % 2 == 0).unwrap();
        }
        // a round of each node's handler: backlogs leave as credit comes back
        for ch in chs {
            ch.drain();
        }
    }
    let [c0, c1, c2] = *chs;
    let mut at1 = receive(c1, &[c0, c2], 2 * count as usize);
    at1.sort_by_key(|&(from, _, _)| from); // stable: each source's order stays
    assert_eq!(
        at1,
        [want(0), want(2)].concat(),
        "node 1 got every message in order"
    );
    assert_eq!(
        receive(c0, &[c1], count as usize),
        want(1),
        "node 0 got node 1's"
    );
    assert_eq!(
        receive(c2, &[c1], count as usize),
        want(1),
        "node 2 got node 1's"
    );
}

/// Node 1 leaves things behind: two messages from it wait unread in node 0's ring, and node
/// 0's stream to it is full, with a backlog (node 1 drains nothing, so node 0's backlog
/// cannot leave: what is pending at node 0 is node 1's two messages).
fn leave_leftovers(c0: &Channels, c1: &Channels) {
    send(c1, 0, 200, true).unwrap();
    send(c1, 0, 201, false).unwrap();
    for n in 100..110 {
        send(c0, 1, n, n % 2 == 0).unwrap();
    }
    assert!(c0.backlogged() > 0, "node 0 has a backlog for node 1");
    wait_for("node 1's messages to land at node 0", || c0.pending());
}

/// After the exchange with the new node 1: nothing its predecessor left arrived.
fn nothing_of_the_old_node_1(c0: &Channels, c1: &Channels) {
    assert!(
        c0.try_recv().is_none(),
        "nothing of the old node 1 is left at node 0"
    );
    assert!(
        c1.try_recv().is_none(),
        "nothing of node 0's old backlog reached node 1"
    );
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let hang = common::HangGuard::start();
    while !cond() {
        hang.check(|| format!("waiting for {what}"));
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_restarted_node_rejoins_with_fresh_streams_and_the_incarnation_given_up_on_is_refused() {
    for encrypt in [false, true] {
        rejoin(encrypt);
    }
}

fn rejoin(encrypt: bool) {
    let ls: Vec<TcpListener> = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    let first_incarnation = 1_000;
    let starts: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let c = cfg(i as u8, &addrs, encrypt, first_incarnation + i as u64);
            std::thread::spawn(move || {
                TcpTransport::start(c, l, Arc::new(LAYOUT.region().unwrap())).unwrap()
            })
        })
        .collect();
    let ts: Vec<Arc<TcpTransport>> = starts.into_iter().map(|h| h.join().unwrap()).collect();
    let (c0, c1, c2) = (
        channels(ts[0].clone(), true),
        channels(ts[1].clone(), true),
        channels(ts[2].clone(), true),
    );
    exchange(&[&c0, &c1, &c2], 0, 10);

    leave_leftovers(&c0, &c1);
    ts[1].shutdown(); // killed: its sockets close
    drop((c1, ts[1].clone()));
    wait_for("nodes 0 and 2 to see node 1 dead", || {
        !ts[0].peer_alive(1) && !ts[2].peer_alive(1)
    });

    // The restarted node: same id and address, a new incarnation, a fresh region.
    let again = TcpTransport::start(
        cfg(1, &addrs, encrypt, first_incarnation + 10),
        bind_again(addrs[1]),
        Arc::new(LAYOUT.region().unwrap()),
    )
    .expect("the restarted node 1 joins the running cluster");
    let c1 = channels(again.clone(), true);
    wait_for("nodes 0 and 2 to take node 1 back", || {
        ts[0].peer_alive(1) && ts[2].peer_alive(1)
    });
    assert!(
        again.taken_back(),
        "the restarted node knows it was taken back"
    );
    assert!(!ts[0].taken_back() && !ts[2].taken_back());
    assert_eq!(ts[0].incarnation_of(1), Some(first_incarnation + 10));
    assert_eq!(ts[2].incarnation_of(1), Some(first_incarnation + 10));
    // Fresh streams both ways: what the old incarnation left is gone, the new messages start
    // at position 0 (each arrives, in order: a stale count on either side would stall or drop
    // them).
    exchange(&[&c0, &c1, &c2], 50, 12);
    nothing_of_the_old_node_1(&c0, &c1);

    // Killed again, and the incarnation the cluster gave up on tries to come back: refused
    // by both (node 2 refuses its dial, node 0 its answer), and the live nodes go on.
    again.shutdown();
    drop((c1, again));
    wait_for("nodes 0 and 2 to see node 1 dead again", || {
        !ts[0].peer_alive(1) && !ts[2].peer_alive(1)
    });
    let mut stale = cfg(1, &addrs, encrypt, first_incarnation + 10);
    stale.connect_timeout = Duration::from_secs(2);
    let refused = TcpTransport::start(
        stale,
        bind_again(addrs[1]),
        Arc::new(LAYOUT.region().unwrap()),
    );
    match refused {
        Err(MsgError::Handshake { why, .. }) => assert!(
            why.contains("refused this node") && why.contains("was given up on"),
            "the refused node is told why: {why}"
        ),
        Err(e) => panic!("refused, but with {e}"),
        Ok(_) => panic!("the incarnation given up on rejoined"),
    }
    assert!(!ts[0].peer_alive(1) && !ts[2].peer_alive(1));
    send(&c0, 2, 77, true).unwrap();
    assert_eq!(
        receive(&c2, &[&c0], 1),
        vec![(0, 77, Some(77))],
        "nodes 0 and 2 go on"
    );
    for t in &ts {
        t.shutdown();
    }
}

#[test]
fn a_cluster_that_takes_no_restarted_nodes_refuses_one() {
    let ls: Vec<TcpListener> = (0..2)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    let starts: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let c = cfg(i as u8, &addrs, false, 1 + i as u64);
            let layout = ChannelLayout { nodes: 2, ..LAYOUT };
            std::thread::spawn(move || {
                TcpTransport::start(c, l, Arc::new(layout.region().unwrap())).unwrap()
            })
        })
        .collect();
    let ts: Vec<Arc<TcpTransport>> = starts.into_iter().map(|h| h.join().unwrap()).collect();
    ts[0].shutdown();
    wait_for("node 1 to see node 0 dead", || !ts[1].peer_alive(0));
    let mut c = cfg(0, &addrs, false, 100);
    c.connect_timeout = Duration::from_secs(2);
    let layout = ChannelLayout { nodes: 2, ..LAYOUT };
    let r = TcpTransport::start(c, bind_again(addrs[0]), Arc::new(layout.region().unwrap()));
    match r {
        Err(MsgError::Handshake { why, .. }) => assert!(
            why.contains("node 1 refused this node")
                && why.contains("takes no restarted nodes back"),
            "the refused node is told why: {why}"
        ),
        Err(e) => panic!("refused, but with {e}"),
        Ok(_) => panic!("a node that takes no restarted nodes took node 0 back"),
    }
    assert!(!ts[1].peer_alive(0));
    ts[1].shutdown();
}

/// Over `mem`: node 1 crashes leaving unread messages at node 0 and a backlog to it there, and
/// is revived: its old incarnation's writes fail, the live nodes reset their streams with it
/// (their hooks ran), its region is a new one, and 12 more messages each way arrive in order
/// with nothing of the old incarnation. Reviving a live node, or one whose peers take no
/// restarted nodes back, is refused.
#[test]
fn a_revived_mem_node_has_fresh_streams_and_its_old_incarnation_writes_nothing() {
    let ts = mem_cluster((0..3).map(|_| LAYOUT.region().unwrap()).collect()).unwrap();
    let (c0, c1, c2) = (
        channels(ts[0].clone(), true),
        channels(ts[1].clone(), true),
        channels(ts[2].clone(), true),
    );
    exchange(&[&c0, &c1, &c2], 0, 10);
    leave_leftovers(&c0, &c1);
    let e = ts[0].revive(1).err().expect("a live node is not revived");
    assert!(e.contains("alive"), "{e}");
    ts[0].kill(1);
    drop(c1);
    let old = ts[1].clone();
    let again = ts[0].revive(1).expect("node 1 revives");
    assert!(again.taken_back() && !ts[0].taken_back());
    assert_eq!((ts[0].connection(1), ts[2].connection(1)), (1, 1));
    assert!(ts[0].peer_alive(1) && again.peer_alive(0));
    assert!(
        matches!(old.write(0, 0, &[0; 8]), Err(MsgError::PeerDead(_))),
        "the old incarnation writes nothing"
    );
    let c1 = channels(again.clone(), true);
    exchange(&[&c0, &c1, &c2], 50, 12);
    nothing_of_the_old_node_1(&c0, &c1);

    // a cluster whose nodes take no restarted nodes back refuses a revival
    let layout = ChannelLayout { nodes: 2, ..LAYOUT };
    let ts = mem_cluster((0..2).map(|_| layout.region().unwrap()).collect()).unwrap();
    ts[0].kill(1);
    let e = ts[0]
        .revive(1)
        .err()
        .expect("node 0 takes no restarted nodes back");
    assert!(e.contains("node 0 takes no restarted nodes back"), "{e}");
    assert!(!ts[0].peer_alive(1));
}
