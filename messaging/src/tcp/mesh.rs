//! Connecting every pair of nodes once: lower ids dial higher ones, each node accepts its
//! peers (refusing strangers), and free loopback addresses for local clusters.

use super::*;

/// `n` loopback addresses (127.0.0.1) whose ports are free now, for a cluster of processes
/// on one host (tests, `shoal ycsb --transport tcp`). The ports lie below the kernel's
/// ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`) when there is room, so no
/// outgoing connection on the host can take one between now and the moment its node binds
/// it; successive calls in one process never return a port twice. Falls back to ports the
/// kernel picks when the ephemeral range leaves no room below it.
pub fn free_loopback_addrs(n: usize) -> std::io::Result<Vec<SocketAddr>> {
    use std::sync::atomic::AtomicU32;
    /// Lowest port handed out (well above the ports of common services).
    pub(super) const LOW: u32 = 10_000;
    /// Where this process's next search starts, as an offset into the range (`u32::MAX`: not
    /// chosen yet; then at random, so that concurrent processes rarely meet).
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let span = ephemeral_low.saturating_sub(LOW);
    if span < 1000 {
        let ls = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<std::io::Result<Vec<_>>>()?;
        return ls.iter().map(TcpListener::local_addr).collect();
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let seed = std::process::id().wrapping_mul(2_654_435_761) ^ nanos;
    // Relaxed: the counter only spreads searches; it orders nothing else.
    let _ = NEXT.compare_exchange(u32::MAX, seed % span, Ordering::Relaxed, Ordering::Relaxed);
    let mut out = Vec::with_capacity(n);
    for _ in 0..span {
        if out.len() == n {
            break;
        }
        let port = LOW + NEXT.fetch_add(1, Ordering::Relaxed) % span;
        // Free if it can be bound now (the listener is closed again at once; nothing
        // on the host takes such a port on its own).
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port as u16)) {
            out.push(l.local_addr()?);
        }
    }
    if out.len() < n {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrNotAvailable,
            format!(
                "only {} free loopback ports below {ephemeral_low}",
                out.len()
            ),
        ));
    }
    Ok(out)
}

/// Connect this node to every peer over TCP: dial the higher ids, accept the lower ones on
/// `listener`, each connection opened with a validated hello (`magic` names the transport, so a
/// `tcp` node and an `rdma` node never pair up). Returns one link per node (`None` at this
/// node's own index) and the listener, which the caller keeps serving: the tcp transport takes
/// restarted nodes on it (`rejoin.rs`), rdma refuses every later connection
/// ([`reject_strangers`]).
pub(crate) fn connect_mesh(
    cfg: &TcpConfig,
    listener: TcpListener,
    magic: [u8; 4],
) -> Result<(Vec<Option<Link>>, TcpListener), MsgError> {
    let nodes = cfg.addrs.len();
    if nodes == 0 || nodes > 64 || cfg.node as usize >= nodes {
        return Err(MsgError::Config(format!(
            "node {} in a cluster of {nodes} addresses (1 to 64 nodes)",
            cfg.node
        )));
    }
    let ends = Ends {
        magic,
        cluster: cfg.cluster_id,
        me: cfg.node,
        nodes: nodes as u8,
        incarnation: cfg.incarnation,
        messages: cfg.messages_version,
        taking_back: false,
    };
    let nodes = nodes as u8;
    let deadline = Instant::now() + cfg.connect_timeout;
    let mut streams: Vec<Option<Link>> = (0..nodes).map(|_| None).collect();
    // accept lower ids in the background while dialing higher ids
    let expect_lower = cfg.node as usize;
    let acceptor = {
        let listener = listener.try_clone().map_err(io)?;
        let secret: Arc<[u8]> = cfg.secret.clone().into();
        std::thread::Builder::new()
            .name(format!("shoal-tcp-accept-{}", cfg.node))
            .spawn(move || accept_peers(listener, Who { ends, secret }, expect_lower, deadline))
            .map_err(io)?
    };
    for peer in cfg.node + 1..nodes {
        let addr = cfg.addrs[peer as usize];
        let (stream, met) = dial(addr, &ends, peer, deadline, &cfg.secret)?;
        streams[peer as usize] = Some(Link {
            stream,
            met,
            dialed: true,
        });
    }
    let accepted = acceptor
        .join()
        .map_err(|_| MsgError::Io("acceptor thread panicked".into()))??;
    for (stream, met) in accepted {
        let peer = met.node as usize;
        streams[peer] = Some(Link {
            stream,
            met,
            dialed: false,
        });
    }
    Ok((streams, listener))
}

/// Dial `peer` at `addr` until it accepts or `deadline` passes, and do the handshake.
pub(super) fn dial(
    addr: SocketAddr,
    ends: &Ends,
    peer: u8,
    deadline: Instant,
    secret: &[u8],
) -> Result<(TcpStream, Met), MsgError> {
    let hs = |why: String| MsgError::Handshake {
        addr: addr.to_string(),
        why,
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(hs(format!(
                "node {peer} did not accept a connection in time"
            )));
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(1))) {
            // A dial to a port nobody listens on yet can connect to itself, when the kernel
            // picks that very port as the source (TCP simultaneous open): not the peer, and it
            // would keep the peer from binding its port. Let go and try again.
            Ok(s) if s.local_addr().is_ok_and(|a| a == addr) => {
                drop(s);
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(mut s) => {
                s.set_nodelay(true).map_err(io)?;
                s.set_read_timeout(Some(left.max(Duration::from_millis(10))))
                    .map_err(io)?;
                let met = handshake_dial(&mut s, ends, peer, secret).map_err(hs)?;
                s.set_read_timeout(None).map_err(io)?;
                return Ok((s, met));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)), // not listening yet
        }
    }
}
/// Accept the `expect` lower-numbered peers. Each connection's hello is read on a thread of
/// its own (at most [`MAX_PENDING_HANDSHAKES`] at once, each for at most
/// [`HANDSHAKE_TIMEOUT`]), so idle or slow connections cannot hold up the real peers (issue
/// 29: ten idle connections used to fail a start-up, one 5 s read at a time).
pub(super) fn accept_peers(
    listener: TcpListener,
    who: Who,
    expect: usize,
    deadline: Instant,
) -> Result<Vec<(TcpStream, Met)>, MsgError> {
    let me = who.ends.me;
    let who = Arc::new(who);
    type Checked = (Option<SocketAddr>, TcpStream, Result<Met, Unmet>);
    let mut got: Vec<(TcpStream, Met)> = Vec::new();
    let mut log = RefusalLog::new(me);
    let (tx, rx) = std::sync::mpsc::channel::<Checked>();
    let mut pending = 0usize;
    listener.set_nonblocking(true).map_err(io)?;
    while got.len() < expect {
        if Instant::now() >= deadline {
            let missing: Vec<usize> = (0..expect)
                .filter(|p| !got.iter().any(|(_, m)| m.node as usize == *p))
                .collect();
            return Err(MsgError::Handshake {
                addr: listener
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
                why: format!("nodes {missing:?} did not connect in time"),
            });
        }
        // hellos read meanwhile
        while let Ok((from_addr, mut s, r)) = rx.try_recv() {
            pending -= 1;
            let r = r.and_then(|met| {
                let from = met.node;
                if from as usize >= expect || got.iter().any(|(_, m)| m.node == from) {
                    let why = format!("unexpected connection from node {from}");
                    let _ = refuse(&mut s, &why);
                    return Err(why.into());
                }
                s.set_read_timeout(None).map_err(|e| e.to_string())?;
                s.write_all(&[WELCOME]).map_err(|e| e.to_string())?;
                Ok(met)
            });
            match r {
                Ok(met) => got.push((s, met)),
                // a running node that will not take this restarted one back: it never will
                Err(Unmet::Refused { node, why }) => {
                    return Err(MsgError::Handshake {
                        addr: from_addr.map(|a| a.to_string()).unwrap_or_default(),
                        why: format!("node {node} refused this node: {why}"),
                    })
                }
                Err(Unmet::Failed(why)) => {
                    log.refused(from_addr, &why);
                    let _ = s.shutdown(Shutdown::Both);
                }
            }
        }
        if got.len() == expect {
            break;
        }
        if pending >= MAX_PENDING_HANDSHAKES {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        let (s, from_addr) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(e) => return Err(io(e)),
        };
        let tx = tx.clone();
        let who = Arc::clone(&who);
        let spawned = std::thread::Builder::new()
            .name(format!("shoal-tcp-hello-{me}"))
            .spawn(move || {
                let mut s = s;
                let r = handshake_accept(&mut s, &who, deadline);
                let _ = tx.send((Some(from_addr), s, r));
            });
        match spawned {
            Ok(_) => pending += 1,
            Err(e) => {
                log.refused(Some(from_addr), &format!("no thread for its hello: {e}"));
            }
        }
    }
    listener.set_nonblocking(false).map_err(io)?;
    Ok(got)
}

/// Refuse every connection on `listener` for the life of the process (a transport that takes
/// no restarted nodes, once its cluster is complete).
#[cfg(feature = "rdma")]
pub(crate) fn reject_strangers(listener: TcpListener, me: u8) {
    let mut log = RefusalLog::new(me);
    for s in listener.incoming() {
        match s {
            Ok(s) => {
                log.refused(s.peer_addr().ok(), "the cluster is already complete");
                let _ = s.shutdown(Shutdown::Both);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}
