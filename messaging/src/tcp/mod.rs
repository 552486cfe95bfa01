//! `tcp`: one process per node, on one host or many. One TCP connection per pair of nodes
//! (the lower id dials, the higher accepts), used in both directions, with TCP_NODELAY.
//!
//! **Handshake** (32 bytes each way, then fresh nonces and proofs of the cluster secret): magic
//! `SHLM`, protocol version, sender node, receiver node, cluster id, the sender's
//! **incarnation** (which start of its process this is: [`TcpConfig::incarnation`]) and the
//! version of the messages its layer above sends ([`TcpConfig::messages_version`]). The
//! acceptor checks all of it (and that it expects that peer) before answering with its own;
//! the dialer checks the answer. Anything else closes the connection with a logged error.
//!
//! **Frames**: `offset u64 | len u32 | reserved u32 | len bytes`, a one-sided write into the
//! receiver's region. With `encrypt` (a cluster secret is then required) every frame is sealed
//! with keys derived from the handshake (messaging/src/seal.rs): `sealed_len u32 | ciphertext | tag`;
//! such nodes say hello with the magic `SHLE`, so an encrypting node and a plain one refuse
//! each other with an error that says so. A receiver thread per peer applies frames in order,
//! and once it has applied every frame that arrived it runs its node's handler round itself
//! ([`Region::serve`]) before it blocks in the next read: the round's answers leave from the
//! thread that read the requests, with no handler thread woken in between (see [`Burst`]).
//! A round's sends never wait for credit (messaging/src/channel.rs, "A send never waits"), so
//! a receiver running one never stops landing the credit its peer returns. A frame that is too
//! large, misaligned, or outside the region closes the connection with a logged error, before
//! any byte of it is applied; so does a truncated frame (EOF mid-frame). Nothing a peer sends
//! can make the receiver panic or write out of bounds.
//!
//! **Failure**: when a connection closes or errs, the peer is marked dead and every waiter of
//! the local region is woken; pending and new requests to that peer fail with
//! [`MsgError::PeerDead`]. A killed peer process closes its sockets at once (the kernel sends
//! FIN/RST); a vanished host is caught by the caller's request timeout.
//!
//! **Rejoin** (`rejoin.rs`): a dead peer may connect again as a new incarnation (a restarted
//! process), if the layer above takes restarted nodes ([`Transport::take_rejoins`]); the
//! incarnation the link was given up on never connects again.

mod handshake;
mod mesh;
mod rejoin;
use handshake::*;
pub use handshake::{dial_handshake, incarnation_now};
pub(crate) use mesh::connect_mesh;
pub use mesh::free_loopback_addrs;
#[cfg(feature = "rdma")]
pub(crate) use mesh::reject_strangers;

use crate::error::MsgError;
use crate::region::Region;
use crate::seal::{self, Opener, Sealer, Transcript};
use crate::transport::{RejoinHook, Transport};
use byteorder::{ByteOrder, LittleEndian};
use parking_lot::Mutex;
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Hello magic of the `tcp` transport.
const MAGIC: [u8; 4] = *b"SHLM";
/// Hello magic of the `tcp` transport with sealed (encrypted) frames.
const SEALED_MAGIC: [u8; 4] = *b"SHLE";
/// Wire protocol version; both sides must match (2: the handshake proves the cluster secret;
/// 3: hellos carry the sender's incarnation, the version of the messages above and flags).
pub const PROTOCOL_VERSION: u16 = 3;
/// Largest single write a peer may send (a page plus slack).
pub const MAX_FRAME: usize = 1 << 20;
const HELLO: usize = 32;
/// Handshake nonce bytes (fresh per connection and side: a recorded handshake does not verify
/// against a new nonce).
const NONCE: usize = 16;
/// HMAC-SHA256 proof bytes.
const PROOF: usize = 32;
const HEADER: usize = 16;
/// Bytes a receiver thread reads from its connection at most per system call.
const READ_BUFFER: usize = 64 << 10;

/// Cluster membership and timing of a TCP node.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TcpConfig {
    pub node: u8,
    pub cluster_id: u64,
    /// Listening address of every node, indexed by node id.
    pub addrs: Vec<SocketAddr>,
    /// How long `start` waits for all peers to connect.
    pub connect_timeout: Duration,
    /// The cluster secret both ends of every connection prove they know (HMAC-SHA256 over both
    /// sides' hellos and fresh nonces). Empty: no secret, the proofs are still exchanged but
    /// anyone can make them (loopback and trusted networks only; see docs/cluster.md).
    pub secret: Vec<u8>,
    /// Seal every frame (AES-256-GCM with per-connection keys, messaging/src/seal.rs). Needs a
    /// secret; every node of a cluster must agree.
    pub encrypt: bool,
    /// Which start of this node's process this is, told to every peer in the handshake. A peer
    /// that lost its link to this node takes a connection from it again only with a larger
    /// incarnation (a restarted process, not the one it gave up on). Default: the microseconds
    /// since the Unix epoch when the config was made ([`incarnation_now`]).
    pub incarnation: u64,
    /// The version of the messages the layer above sends over this transport (the engine's
    /// coherence messages): both ends of a connection must say the same, so that nodes of
    /// two builds whose messages differ refuse each other at the handshake instead of
    /// dropping each other's messages as malformed. Default 0.
    pub messages_version: u16,
}

impl TcpConfig {
    /// Node `node` of cluster `cluster_id`, whose nodes listen at `addrs`: 30 s to connect, no
    /// secret, no encryption (set the fields to change them).
    pub fn new(node: u8, cluster_id: u64, addrs: Vec<SocketAddr>) -> TcpConfig {
        TcpConfig {
            node,
            cluster_id,
            addrs,
            connect_timeout: Duration::from_secs(30),
            secret: Vec::new(),
            encrypt: false,
            incarnation: incarnation_now(),
            messages_version: 0,
        }
    }
}

/// One peer: its current connection (replaced when the peer rejoins as a new incarnation).
struct Peer {
    addr: SocketAddr,
    /// The connection's socket, to close it. Locked only to close or replace it, never while
    /// writing (a write blocked on a stopped peer must not keep anyone from closing).
    socket: Mutex<Socket>,
    writer: Mutex<Writer>,
    /// The current connection is open. Release when set (after the connection is in place),
    /// Acquire when read.
    alive: AtomicBool,
    /// The receiver thread of the current connection (joined before a new one starts).
    reader: Mutex<Option<JoinHandle<()>>>,
    /// An attempt to connect this (dead) peer again is under way (`rejoin.rs`).
    joining: AtomicBool,
    /// [`Socket::link`] of the current connection, for readers that take no lock
    /// ([`Transport::connection`]).
    connection: AtomicU64,
}

/// A peer's socket, which connection it is, and which incarnation of the peer is behind it.
struct Socket {
    stream: TcpStream,
    /// Connections to this peer so far (the first is 1): a failure seen on an older
    /// connection does not close the current one.
    link: u64,
    incarnation: u64,
}

/// The sending end of one connection: the stream, the sealer of an encrypted one, and a frame
/// buffer reused from write to write.
struct Writer {
    stream: TcpStream,
    /// The connection `stream` belongs to ([`Socket::link`]).
    link: u64,
    sealer: Option<Sealer>,
    frame: Vec<u8>,
}

/// A connected, authenticated peer connection as [`connect_mesh`] returns it.
pub(crate) struct Link {
    pub stream: TcpStream,
    /// Who the other end proved to be, and what both ends saw (keys for sealed frames are
    /// derived from it).
    met: Met,
    /// This end dialed (the lower node id dials).
    dialed: bool,
}

/// A new connection's parts: the socket and writer to put in its peer's place, and the
/// receiving end for its receiver thread.
struct Connection {
    socket: Socket,
    writer: Writer,
}

impl Connection {
    /// Split link `l` (connection number `link` to its peer) into its parts, with the keys of
    /// its sealed frames when `encrypt`.
    #[allow(clippy::type_complexity)]
    fn new(
        l: Link,
        link: u64,
        secret: &[u8],
        encrypt: bool,
    ) -> Result<(Connection, (TcpStream, Option<Opener>)), MsgError> {
        l.stream.set_read_timeout(None).map_err(io)?;
        let (sealer, opener) = if encrypt {
            let k = seal::keys(secret, &l.met.transcript, l.dialed);
            (Some(k.send), Some(k.recv))
        } else {
            (None, None)
        };
        let c = Connection {
            writer: Writer {
                stream: l.stream.try_clone().map_err(io)?,
                link,
                sealer,
                frame: Vec::new(),
            },
            socket: Socket {
                stream: l.stream.try_clone().map_err(io)?,
                link,
                incarnation: l.met.incarnation,
            },
        };
        Ok((c, (l.stream, opener)))
    }
}

/// One node's TCP transport.
pub struct TcpTransport {
    node: u8,
    nodes: u8,
    cluster_id: u64,
    region: Arc<Region>,
    peers: Vec<Option<Peer>>,
    closed: AtomicBool,
    /// How this node presents itself in hellos, and what it asks of peers' hellos.
    ends: Ends,
    secret: Arc<[u8]>,
    encrypt: bool,
    /// Set by the layer above when it takes restarted nodes back ([`Transport::take_rejoins`]).
    rejoin: OnceLock<RejoinHook>,
    /// Peers took this node back at its start: it restarted into a running cluster.
    taken_back: bool,
}

impl TcpTransport {
    /// Connect to every peer (dial higher ids, accept lower ones on `listener`), then start a
    /// receiver thread per peer. Blocks until the cluster is connected or the timeout passes.
    pub fn start(
        cfg: TcpConfig,
        listener: TcpListener,
        region: Arc<Region>,
    ) -> Result<Arc<Self>, MsgError> {
        if cfg.encrypt && cfg.secret.is_empty() {
            return Err(MsgError::Config(
                "encrypted frames need a cluster secret (keys are derived from it)".into(),
            ));
        }
        let magic = if cfg.encrypt { SEALED_MAGIC } else { MAGIC };
        let (mut links, listener) = connect_mesh(&cfg, listener, magic)?;
        let nodes = links.len() as u8;
        let mut peers = Vec::with_capacity(nodes as usize);
        let mut firsts = Vec::new();
        let taken_back = links.iter().flatten().any(|l| l.met.taking_back);
        for (i, l) in links.drain(..).enumerate() {
            peers.push(match l {
                None if i == cfg.node as usize => None,
                None => return Err(MsgError::PeerDead(i as u8)),
                Some(l) => {
                    let (c, reader) = Connection::new(l, 1, &cfg.secret, cfg.encrypt)?;
                    firsts.push((i as u8, reader));
                    Some(Peer {
                        addr: cfg.addrs[i],
                        socket: Mutex::new(c.socket),
                        writer: Mutex::new(c.writer),
                        alive: AtomicBool::new(true),
                        reader: Mutex::new(None),
                        joining: AtomicBool::new(false),
                        connection: AtomicU64::new(1),
                    })
                }
            });
        }
        let t = Arc::new(TcpTransport {
            node: cfg.node,
            nodes,
            cluster_id: cfg.cluster_id,
            region,
            peers,
            closed: AtomicBool::new(false),
            ends: Ends {
                magic,
                cluster: cfg.cluster_id,
                me: cfg.node,
                nodes,
                incarnation: cfg.incarnation,
                messages: cfg.messages_version,
                taking_back: false,
            },
            secret: cfg.secret.clone().into(),
            encrypt: cfg.encrypt,
            rejoin: OnceLock::new(),
            taken_back,
        });
        for (peer, reader) in firsts {
            t.start_reader(peer, 1, reader)?;
        }
        rejoin::serve(&t, listener)?;
        Ok(t)
    }

    /// Start the receiver thread of connection `link` to `peer`.
    fn start_reader(
        self: &Arc<Self>,
        peer: u8,
        link: u64,
        (stream, opener): (TcpStream, Option<Opener>),
    ) -> Result<(), MsgError> {
        let Some(Some(p)) = self.peers.get(peer as usize) else {
            return Err(MsgError::NoSuchPeer(peer, self.nodes));
        };
        let t = Arc::clone(self);
        let h = std::thread::Builder::new()
            .name(format!("shoal-tcp-rx-{}-{peer}", self.node))
            .spawn(move || t.receive(peer, link, stream, opener))
            .map_err(io)?;
        *p.reader.lock() = Some(h);
        Ok(())
    }

    /// The incarnation of `peer` behind its current (or last) connection.
    pub fn incarnation_of(&self, peer: u8) -> Option<u64> {
        match self.peers.get(peer as usize) {
            Some(Some(p)) => Some(p.socket.lock().incarnation),
            _ => None,
        }
    }

    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// Check a frame header: the region offset and length it announces.
    fn check_header(&self, head: &[u8]) -> Result<(usize, usize), String> {
        let offset = LittleEndian::read_u64(&head[0..]);
        let len = LittleEndian::read_u32(&head[8..]) as usize;
        if len > MAX_FRAME {
            return Err(format!("frame of {len} bytes exceeds {MAX_FRAME}"));
        }
        let offset =
            usize::try_from(offset).map_err(|_| format!("frame offset {offset} out of range"))?;
        self.region.check(offset, len).map_err(|e| e.to_string())?;
        Ok((offset, len))
    }

    /// Apply `peer`'s frames in order until the connection closes or a frame is bad. Reads go
    /// through a buffer of [`READ_BUFFER`] bytes: one system call takes in every frame that has
    /// arrived (a page's frame and its message's, a burst of messages) instead of two per
    /// frame.
    fn receive(&self, peer: u8, link: u64, s: TcpStream, opener: Option<Opener>) {
        let mut s = BufReader::with_capacity(READ_BUFFER, s);
        let mut burst = Burst {
            region: &self.region,
            helping: false,
        };
        let why = match opener {
            None => self.receive_plain(&mut s, &mut burst),
            Some(o) => self.receive_sealed(peer, &mut s, o, &mut burst),
        };
        drop(burst);
        if !self.closed.load(Ordering::Acquire) {
            log::error!("node {}: dropping node {peer}: {why}", self.node);
        }
        self.mark_dead(peer, Some(link));
    }

    /// Plain frames; returns why the connection ended.
    fn receive_plain(&self, s: &mut BufReader<TcpStream>, burst: &mut Burst) -> String {
        let mut head = [0u8; HEADER];
        let mut buf = Vec::new();
        loop {
            if s.buffer().is_empty() {
                burst.end();
            }
            if let Err(e) = s.read_exact(&mut head) {
                return format!("connection closed ({e})");
            }
            burst.begin();
            let (offset, len) = match self.check_header(&head) {
                Ok(x) => x,
                Err(why) => return why,
            };
            buf.resize(len, 0);
            if let Err(e) = s.read_exact(&mut buf) {
                return format!("truncated frame ({e})");
            }
            if let Err(e) = self.region.apply(offset, &buf) {
                return e.to_string();
            }
        }
    }

    /// Sealed frames: each is authenticated (and decrypted) whole before its header is even
    /// looked at; returns why the connection ended.
    fn receive_sealed(
        &self,
        peer: u8,
        s: &mut BufReader<TcpStream>,
        mut opener: Opener,
        burst: &mut Burst,
    ) -> String {
        let mut len = [0u8; seal::LEN];
        let mut buf = Vec::new();
        loop {
            if s.buffer().is_empty() {
                burst.end();
            }
            if let Err(e) = s.read_exact(&mut len) {
                return format!("connection closed ({e})");
            }
            burst.begin();
            let sealed_len = u32::from_le_bytes(len) as usize;
            if !(HEADER + seal::TAG..=HEADER + MAX_FRAME + seal::TAG).contains(&sealed_len) {
                return format!("sealed frame of {sealed_len} bytes");
            }
            buf.resize(sealed_len, 0);
            if let Err(e) = s.read_exact(&mut buf) {
                return format!("truncated frame ({e})");
            }
            if opener.open(len, &mut buf).is_err() {
                return format!(
                    "a frame failed authentication (altered, replayed or not sealed by node \
                     {peer})"
                );
            }
            let plain = &buf[..sealed_len - seal::TAG];
            let (offset, len) = match self.check_header(&plain[..HEADER]) {
                Ok(x) => x,
                Err(why) => return why,
            };
            if plain.len() != HEADER + len {
                return format!(
                    "sealed frame of {} bytes announces {len}",
                    plain.len() - HEADER
                );
            }
            if let Err(e) = self.region.apply(offset, &plain[HEADER..]) {
                return e.to_string();
            }
        }
    }
    /// Send `writes` to `peer` as frames in one system call (each frame sealed on its own
    /// with `encrypt`). A write that is empty, misaligned or larger than [`MAX_FRAME`] fails
    /// before anything is sent; a failed send marks the peer dead.
    fn send_frames(&self, peer: u8, writes: &[(usize, &[u8])]) -> Result<(), MsgError> {
        let p = match self.peers.get(peer as usize) {
            Some(Some(p)) => p,
            _ => return Err(MsgError::NoSuchPeer(peer, self.nodes)),
        };
        if !p.alive.load(Ordering::Acquire) {
            return Err(MsgError::PeerDead(peer));
        }
        if let Some(&(offset, data)) = writes.iter().find(|(offset, data)| {
            data.len() > MAX_FRAME
                || data.is_empty()
                || !data.len().is_multiple_of(8)
                || !offset.is_multiple_of(8)
        }) {
            return Err(MsgError::OutOfBounds {
                offset,
                len: data.len(),
                region: MAX_FRAME,
            });
        }
        let r = {
            let mut w = p.writer.lock();
            let Writer {
                stream,
                link,
                sealer,
                frame,
            } = &mut *w;
            let link = *link;
            frame.clear();
            for &(offset, data) in writes {
                let start = frame.len();
                if sealer.is_some() {
                    frame.extend_from_slice(&[0u8; seal::LEN]);
                }
                frame.extend_from_slice(&(offset as u64).to_le_bytes());
                frame.extend_from_slice(&(data.len() as u32).to_le_bytes());
                frame.extend_from_slice(&[0u8; 4]);
                frame.extend_from_slice(data);
                if let Some(sealer) = sealer {
                    sealer.seal_at(frame, start);
                }
            }
            let r = stream.write_all(frame);
            if frame.capacity()
                > 2 * (2 * HEADER + crate::mailbox::PAGE_BYTES + 2 * (seal::LEN + seal::TAG) + 64)
            {
                *frame = Vec::new(); // do not keep a large frame's buffer
            }
            r.map_err(|e| (e, link))
        };
        r.map_err(|(e, link)| {
            log::error!(
                "node {}: writing to node {peer} at {}: {e}",
                self.node,
                p.addr
            );
            self.mark_dead(peer, Some(link));
            MsgError::PeerDead(peer)
        })
    }

    /// Close `peer`'s connection `link` (`None`: whichever is current) and mark the peer dead,
    /// unless a newer connection replaced that one meanwhile.
    fn mark_dead(&self, peer: u8, link: Option<u64>) {
        if let Some(Some(p)) = self.peers.get(peer as usize) {
            let s = p.socket.lock();
            if link.is_none_or(|l| l == s.link) {
                p.alive.store(false, Ordering::Release);
                let _ = s.stream.shutdown(Shutdown::Both);
            }
        }
        self.region.wake_all();
    }

    /// Close every connection (peers see this node die).
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        for p in self.peers.iter().flatten() {
            let s = p.socket.lock();
            p.alive.store(false, Ordering::Release);
            let _ = s.stream.shutdown(Shutdown::Both);
        }
        self.region.wake_all();
    }
}

/// A receiver thread's burst of frames: from the first frame read after its buffer ran empty
/// until it runs empty again. During a burst the thread counts as a helper of its region
/// ([`Region::start_helping`]), so the frames it applies wake no handler thread; at the end it
/// runs the region's service (its node's handler round) itself, a few times while there is
/// work, and stops helping (the last helper to stop looks once more, so nothing that landed
/// meanwhile is left unhandled). Dropping a burst in progress stops helping too.
struct Burst<'a> {
    region: &'a Region,
    helping: bool,
}

/// Rounds a receiver thread runs at most at the end of a burst before it reads again (the
/// frames it has not read yet may be what the next round needs).
const BURST_ROUNDS: usize = 4;

impl Burst<'_> {
    fn begin(&mut self) {
        if !self.helping {
            self.region.start_helping();
            self.helping = true;
        }
    }

    fn end(&mut self) {
        if self.helping {
            for _ in 0..BURST_ROUNDS {
                if !self.region.serve() {
                    break;
                }
            }
            self.helping = false;
            self.region.stop_helping();
        }
    }
}

impl Drop for Burst<'_> {
    fn drop(&mut self) {
        if self.helping {
            self.helping = false;
            self.region.stop_helping();
        }
    }
}

impl Transport for TcpTransport {
    fn sever(&self, peer: u8) {
        self.mark_dead(peer, None); // closes the connection: the peer sees this node die
    }
    fn departing(&self) {
        self.closed.store(true, Ordering::Release);
    }
    fn leave(&self, linger: Duration) {
        self.closed.store(true, Ordering::Release);
        // FIN after everything written; keep reading so peers' last writes still land
        for p in self.peers.iter().flatten() {
            let _ = p.socket.lock().stream.shutdown(Shutdown::Write);
        }
        let t0 = Instant::now();
        while t0.elapsed() < linger
            && self
                .peers
                .iter()
                .flatten()
                .any(|p| p.alive.load(Ordering::Acquire))
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.shutdown();
    }
    fn answer_poll(&self) -> Duration {
        // a loopback round trip through two reader threads and the home's handler: 60-100 us
        // on a busy 2-core machine (docs/BENCHMARKS.md, issue 24)
        Duration::from_micros(200)
    }
    fn node(&self) -> u8 {
        self.node
    }
    fn nodes(&self) -> u8 {
        self.nodes
    }
    fn region(&self) -> &Region {
        &self.region
    }
    fn write(&self, peer: u8, offset: usize, data: &[u8]) -> Result<(), MsgError> {
        if peer == self.node {
            return self.region.apply(offset, data);
        }
        self.send_frames(peer, &[(offset, data)])
    }
    fn write_two(
        &self,
        peer: u8,
        first: (usize, &[u8]),
        then: (usize, &[u8]),
    ) -> Result<(), MsgError> {
        if peer == self.node {
            self.region.apply(first.0, first.1)?;
            return self.region.apply(then.0, then.1);
        }
        self.send_frames(peer, &[first, then])
    }
    fn peer_alive(&self, peer: u8) -> bool {
        peer == self.node
            || matches!(self.peers.get(peer as usize), Some(Some(p)) if p.alive.load(Ordering::Acquire))
    }
    fn connection(&self, peer: u8) -> u64 {
        match self.peers.get(peer as usize) {
            // Acquire: pairs with the Release in `rejoin::install`
            Some(Some(p)) => p.connection.load(Ordering::Acquire),
            _ => 0,
        }
    }
    fn taken_back(&self) -> bool {
        self.taken_back
    }
    fn take_rejoins(&self, hook: RejoinHook) -> bool {
        self.rejoin.set(hook).is_ok()
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

pub(crate) fn io(e: std::io::Error) -> MsgError {
    MsgError::Io(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node `me` of a cluster 7 of `nodes`, incarnation 5, messages of version 1.
    fn ends(me: u8, nodes: u8) -> Ends {
        Ends {
            magic: MAGIC,
            cluster: 7,
            me,
            nodes,
            incarnation: 5,
            messages: 1,
            taking_back: false,
        }
    }

    #[test]
    fn a_handshake_proof_verifies_only_with_the_same_secret_and_nonces() {
        let hd = hello(&ends(0, 2), 1);
        let ha = hello(&ends(1, 2), 0);
        let (nd, na) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(nd, na, "fresh nonces");
        let p = make_proof(b"s3cret", DIALER, (&hd, &nd), (&ha, &na));
        assert!(proof_ok(b"s3cret", DIALER, (&hd, &nd), (&ha, &na), &p));
        // another secret, the other role, or a replay against a new acceptor nonce: refused
        assert!(!proof_ok(b"other", DIALER, (&hd, &nd), (&ha, &na), &p));
        assert!(!proof_ok(b"s3cret", ACCEPTOR, (&hd, &nd), (&ha, &na), &p));
        let na2 = nonce().unwrap();
        assert!(!proof_ok(b"s3cret", DIALER, (&hd, &nd), (&ha, &na2), &p));
        assert!(!proof_ok(
            b"s3cret",
            DIALER,
            (&hd, &nd),
            (&ha, &na),
            &p[..31]
        ));
    }

    #[test]
    fn refused_connections_are_logged_once_per_interval_with_a_count() {
        let mut log = RefusalLog::new(1);
        let lines = (0..1000)
            .filter(|_| log.refused(None, "the cluster is already complete"))
            .count();
        assert_eq!(lines, 1, "a burst of refusals makes one line");
        assert_eq!(log.unlogged, 999, "the rest are counted for the next line");
        log.since = Some(Instant::now() - REFUSAL_LOG_EVERY);
        assert!(
            log.refused(None, "again"),
            "a line once the interval passed"
        );
        assert_eq!(log.unlogged, 0);
    }

    #[test]
    fn hello_validation() {
        let h = hello(&ends(0, 2), 1);
        assert_eq!(check_hello(&h, &ends(1, 2)), Ok((0, 5)));
        let other_cluster = Ends {
            cluster: 8,
            ..ends(1, 2)
        };
        assert!(check_hello(&h, &other_cluster)
            .unwrap_err()
            .contains("cluster id"));
        assert!(check_hello(&h, &ends(2, 3))
            .unwrap_err()
            .contains("addressed to node 1"));
        assert!(check_hello(&hello(&ends(5, 6), 1), &ends(1, 2))
            .unwrap_err()
            .contains("not a peer"));
        let mut bad = h;
        bad[0] = b'X';
        assert!(check_hello(&bad, &ends(1, 2))
            .unwrap_err()
            .contains("magic"));
        let mut v = h;
        v[4] = 9;
        assert!(check_hello(&v, &ends(1, 2))
            .unwrap_err()
            .contains("protocol version"));
        let newer = Ends {
            messages: 2,
            ..ends(1, 2)
        };
        assert!(check_hello(&h, &newer)
            .unwrap_err()
            .contains("messages of version 1, this node's are of version 2"));
        let mut incarnation = h;
        incarnation[16] = 9;
        assert_eq!(
            check_hello(&incarnation, &ends(1, 2)),
            Ok((0, 9)),
            "the incarnation is the sender's own"
        );
    }

    /// Ports for node processes: distinct across calls, bindable, and below the ephemeral
    /// range, where no outgoing connection can take them.
    #[test]
    fn free_loopback_addrs_are_distinct_bindable_and_below_the_ephemeral_range() {
        let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok());
        let mut seen = std::collections::HashSet::new();
        for _ in 0..20 {
            for a in free_loopback_addrs(3).unwrap() {
                assert!(a.ip().is_loopback());
                assert!(seen.insert(a.port()), "port {} handed out twice", a.port());
                if let Some(low) = low.filter(|&l| l >= 11_000) {
                    assert!(a.port() < low, "port {} in the ephemeral range", a.port());
                }
                TcpListener::bind(a).unwrap();
            }
        }
    }
}
