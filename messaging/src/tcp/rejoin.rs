//! Taking a restarted node back into a running cluster.
//!
//! Once the mesh is up, the listener keeps serving: a connection from a lower-numbered peer
//! whose link this node lost is taken if the peer comes back as a **new incarnation** (a
//! larger [`TcpConfig::incarnation`] than the one behind the lost link) and the layer above
//! takes restarted nodes ([`Transport::take_rejoins`]). A higher-numbered peer is dialed again
//! (the lower id dials, as at start), every [`REDIAL_EVERY`] while it is dead. The restarted
//! node itself does nothing special: it starts as at a cluster's start, and the live nodes'
//! dials and its own meet as they would then.
//!
//! Refused, each with a logged reason (at most one line per interval,
//! [`RefusalLog`]): a peer that is still connected here (a second process with its id, or a
//! restart before this node noticed the death), the incarnation the link was lost with (a
//! node that was cut off and resumed, not restarted: it must restart to rejoin), and any
//! restarted node when the layer above takes none (the whole cluster must restart).
//!
//! **Order.** The layer above's hook runs while the peer is still dead here, once the other
//! end proved who it is and that it is a new incarnation, before the step after which the
//! other end counts the connection (each side's last byte, [`WELCOME`]: the acceptor's, or on
//! the dialing side its verdict after its proof): it resets what this node keeps about the
//! peer. A refusal, by either side once the other proved who it is, carries its reason
//! ([`refuse`]): a restarted node that is refused fails its start saying why. Then the old connection's receiver thread has ended (joined), the new
//! socket and writer replace the old ones, the peer is marked alive, and the new receiver
//! starts. So no frame of the old connection is applied after the reset, and no frame of the
//! new one before it; a failure seen on the old connection afterwards does not close the new
//! one (connections are numbered, [`Socket::link`]).

use super::*;
use std::sync::atomic::AtomicUsize;
use std::sync::Weak;

/// How often a node dials its dead higher-numbered peers (a restarted one listens again).
pub(super) const REDIAL_EVERY: Duration = Duration::from_millis(200);

/// How long a redial waits for a dead peer's port to accept.
const REDIAL_CONNECT: Duration = Duration::from_millis(200);

/// Serve `listener` for restarted lower-numbered peers, and dial restarted higher-numbered
/// ones, for the life of transport `t`.
pub(super) fn serve(t: &Arc<TcpTransport>, listener: TcpListener) -> Result<(), MsgError> {
    listener.set_nonblocking(true).map_err(io)?;
    let me = t.node;
    let w = Arc::downgrade(t);
    std::thread::Builder::new()
        .name(format!("shoal-tcp-rejoin-{me}"))
        .spawn(move || accept_rejoins(w, listener, me))
        .map_err(io)?;
    if me + 1 < t.nodes {
        let w = Arc::downgrade(t);
        std::thread::Builder::new()
            .name(format!("shoal-tcp-redial-{me}"))
            .spawn(move || redial(w, me))
            .map_err(io)?;
    }
    Ok(())
}

fn accept_rejoins(t: Weak<TcpTransport>, listener: TcpListener, me: u8) {
    let log = Arc::new(Mutex::new(RefusalLog::new(me)));
    let pending = Arc::new(AtomicUsize::new(0));
    loop {
        let Some(tr) = t.upgrade() else {
            return;
        };
        if tr.closed.load(Ordering::Acquire) {
            return;
        }
        let (s, from) = match listener.accept() {
            Ok(x) => x,
            Err(_) => {
                drop(tr); // the transport may go while this thread sleeps
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        // Relaxed: the count only bounds the threads; it orders nothing else.
        if pending.load(Ordering::Relaxed) >= MAX_PENDING_HANDSHAKES {
            log.lock()
                .refused(Some(from), "too many handshakes at once");
            let _ = s.shutdown(Shutdown::Both);
            continue;
        }
        pending.fetch_add(1, Ordering::Relaxed);
        let (log2, pending2) = (Arc::clone(&log), Arc::clone(&pending));
        let spawned = std::thread::Builder::new()
            .name(format!("shoal-tcp-hello-{me}"))
            .spawn(move || {
                if let Err(why) = tr.admit(s) {
                    log2.lock().refused(Some(from), &why);
                }
                pending2.fetch_sub(1, Ordering::Relaxed);
            });
        if let Err(e) = spawned {
            pending.fetch_sub(1, Ordering::Relaxed);
            log.lock()
                .refused(Some(from), &format!("no thread for its hello: {e}"));
        }
    }
}

fn redial(t: Weak<TcpTransport>, me: u8) {
    let mut log = RefusalLog::dialing(me);
    loop {
        std::thread::sleep(REDIAL_EVERY);
        let Some(tr) = t.upgrade() else {
            return;
        };
        if tr.closed.load(Ordering::Acquire) {
            return;
        }
        if tr.rejoin.get().is_none() {
            continue;
        }
        for peer in me + 1..tr.nodes {
            if tr.peer_alive(peer) {
                continue;
            }
            if let Err(why) = tr.redial_one(peer) {
                let addr = match tr.peers.get(peer as usize) {
                    Some(Some(p)) => Some(p.addr),
                    _ => None,
                };
                log.refused(addr, &format!("node {peer} again: {why}"));
            }
        }
    }
}

/// A peer being connected again: at most one attempt per peer at a time.
struct Joining<'a>(&'a AtomicBool);

impl<'a> Joining<'a> {
    fn take(flag: &'a AtomicBool, peer: u8) -> Result<Joining<'a>, String> {
        // Acquire/Release: an attempt sees everything the previous one did to the peer
        flag.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .map(|_| Joining(flag))
            .map_err(|_| format!("node {peer} is being connected again already"))
    }
}

impl Drop for Joining<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl TcpTransport {
    fn peer(&self, peer: u8) -> Result<&Peer, String> {
        match self.peers.get(peer as usize) {
            Some(Some(p)) => Ok(p),
            _ => Err(format!("node {peer} is not a peer of node {}", self.node)),
        }
    }

    /// The accepting side: a connection that arrived after the mesh was up.
    fn admit(self: &Arc<Self>, mut s: TcpStream) -> Result<(), String> {
        let who = Who {
            ends: self.taking_back(),
            secret: Arc::clone(&self.secret),
        };
        let met = handshake_accept(&mut s, &who, Instant::now() + HANDSHAKE_TIMEOUT)
            .map_err(|u| u.to_string())?;
        let peer = met.node;
        // a proven peer is told why it is refused
        let checks = || -> Result<Joining<'_>, String> {
            if peer > self.node {
                return Err(format!(
                    "node {peer} dialed, but a node dials only higher-numbered ones"
                ));
            }
            let p = self.peer(peer)?;
            let joining = Joining::take(&p.joining, peer)?;
            self.may_rejoin(peer, met.incarnation)?;
            self.reset_for_rejoin(peer)?;
            Ok(joining)
        };
        let _joining = match checks() {
            Ok(j) => j,
            Err(why) => {
                let _ = refuse(&mut s, &why);
                return Err(why);
            }
        };
        s.set_read_timeout(None).map_err(|e| e.to_string())?;
        s.write_all(&[WELCOME]).map_err(|e| e.to_string())?;
        self.install(
            Link {
                stream: s,
                met,
                dialed: false,
            },
            peer,
        )
        .map_err(|e| e.to_string())
    }

    /// The dialing side: dial dead peer `peer` again, if something listens at its address.
    fn redial_one(self: &Arc<Self>, peer: u8) -> Result<(), String> {
        let p = self.peer(peer)?;
        let _joining = Joining::take(&p.joining, peer)?;
        let mut s = match TcpStream::connect_timeout(&p.addr, REDIAL_CONNECT) {
            // nothing listens (not restarted yet), or the self-connection of a dial to a free
            // port (see `mesh::dial`)
            Err(_) => return Ok(()),
            Ok(s) if s.local_addr().is_ok_and(|a| a == p.addr) => return Ok(()),
            Ok(s) => s,
        };
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
            .map_err(|e| e.to_string())?;
        // the acceptor counts the connection once it has our verdict: a new incarnation (not
        // the one given up on, resumed) and the reset, before it goes (a refusal tells it why)
        let met = handshake_dial_then(
            &mut s,
            &self.taking_back(),
            peer,
            &self.secret,
            |incarnation| {
                self.may_rejoin(peer, incarnation)
                    .and_then(|()| self.reset_for_rejoin(peer))
            },
        )?;
        self.install(
            Link {
                stream: s,
                met,
                dialed: true,
            },
            peer,
        )
        .map_err(|e| e.to_string())
    }

    /// How this node says hello to a restarted node it takes back.
    fn taking_back(&self) -> Ends {
        Ends {
            taking_back: true,
            ..self.ends
        }
    }

    /// Whether `peer`'s `incarnation` may take its dead predecessor's place.
    fn may_rejoin(&self, peer: u8, incarnation: u64) -> Result<(), String> {
        let p = self.peer(peer)?;
        if p.alive.load(Ordering::Acquire) {
            return Err(format!(
                "node {peer} is connected already (a second process with its id, or a restart \
                 before this node noticed its death: start it again)"
            ));
        }
        let lost = p.socket.lock().incarnation;
        if incarnation <= lost {
            return Err(format!(
                "node {peer} was given up on and has not restarted since (incarnation \
                 {incarnation}, the link was lost with {lost}): a node the cluster gave up on \
                 must restart to rejoin"
            ));
        }
        if self.rejoin.get().is_none() {
            return Err(format!(
                "node {peer} restarted, but this node takes no restarted nodes back: stop \
                 every node and start the cluster again"
            ));
        }
        Ok(())
    }

    /// Run the layer above's hook for dead peer `peer` (see the module doc).
    fn reset_for_rejoin(&self, peer: u8) -> Result<(), String> {
        match self.rejoin.get() {
            Some(hook) => hook(peer),
            None => Err(format!(
                "node {peer} restarted, but this node takes no restarted nodes back"
            )),
        }
    }

    /// Put link `l` in dead peer `peer`'s place and start its receiver.
    fn install(self: &Arc<Self>, l: Link, peer: u8) -> Result<(), MsgError> {
        let p = self.peer(peer).map_err(MsgError::Config)?;
        debug_assert!(!p.alive.load(Ordering::Acquire), "a dead peer is replaced");
        // The old receiver ends (its socket was closed when the peer died) before the new
        // one starts: frames of the two connections never mix.
        let old = p.reader.lock().take();
        if let Some(h) = old {
            let _ = h.join();
        }
        let incarnation = l.met.incarnation;
        let link = p.socket.lock().link + 1;
        let (c, reader) = Connection::new(l, link, &self.secret, self.encrypt)?;
        *p.writer.lock() = c.writer;
        *p.socket.lock() = c.socket;
        // Release (both): the new socket and writer are in place before anyone sees the peer
        // alive or the new connection; alive first, so that a reader that sees the new
        // connection (Acquire) and then looks at the peer sees it alive (the engine's handler
        // must not take the new incarnation for dead: `notice_rejoins`)
        p.alive.store(true, Ordering::Release);
        p.connection.store(link, Ordering::Release);
        self.start_reader(peer, link, reader)?;
        log::warn!(
            "node {}: node {peer} rejoined (incarnation {incarnation}, connection {link})",
            self.node
        );
        self.region.wake_all();
        Ok(())
    }
}
