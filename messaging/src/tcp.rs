//! `tcp`: one process per node, on one host or many. One TCP connection per pair of nodes
//! (the lower id dials, the higher accepts), used in both directions, with TCP_NODELAY.
//!
//! **Handshake** (16 bytes each way): magic `SHLM`, protocol version, sender node, receiver
//! node, cluster id. The acceptor checks all of it (and that it expects that peer) before
//! answering with its own; the dialer checks the answer. Anything else closes the connection
//! with a logged error.
//!
//! **Frames**: `offset u64 | len u32 | reserved u32 | len bytes`, a one-sided write into the
//! receiver's region. With `encrypt` (a cluster secret is then required) every frame is sealed
//! with keys derived from the handshake (messaging/src/seal.rs): `sealed_len u32 | ciphertext | tag`;
//! such nodes say hello with the magic `SHLE`, so an encrypting node and a plain one refuse
//! each other with an error that says so. A receiver thread per peer applies frames in order. A frame that is too
//! large, misaligned, or outside the region closes the connection with a logged error, before
//! any byte of it is applied; so does a truncated frame (EOF mid-frame). Nothing a peer sends
//! can make the receiver panic or write out of bounds.
//!
//! **Failure**: when a connection closes or errs, the peer is marked dead and every waiter of
//! the local region is woken; pending and new requests to that peer fail with
//! [`MsgError::PeerDead`]. A killed peer process closes its sockets at once (the kernel sends
//! FIN/RST); a vanished host is caught by the caller's request timeout.

use crate::error::MsgError;
use crate::region::Region;
use crate::seal::{self, Opener, Sealer, Transcript};
use crate::transport::Transport;
use byteorder::{ByteOrder, LittleEndian};
use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Hello magic of the `tcp` transport.
const MAGIC: [u8; 4] = *b"SHLM";
/// Hello magic of the `tcp` transport with sealed (encrypted) frames.
const SEALED_MAGIC: [u8; 4] = *b"SHLE";
/// Wire protocol version; both sides must match (2: the handshake proves the cluster secret).
pub const PROTOCOL_VERSION: u16 = 2;
/// Largest single write a peer may send (a page plus slack).
pub const MAX_FRAME: usize = 1 << 20;
const HELLO: usize = 16;
/// Handshake nonce bytes (fresh per connection and side: a recorded handshake does not verify
/// against a new nonce).
const NONCE: usize = 16;
/// HMAC-SHA256 proof bytes.
const PROOF: usize = 32;
const HEADER: usize = 16;

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
        }
    }
}

struct Peer {
    addr: SocketAddr,
    stream: TcpStream,
    writer: Mutex<Writer>,
    alive: AtomicBool,
}

/// The sending end of one connection: the stream, the sealer of an encrypted one, and a frame
/// buffer reused from write to write.
struct Writer {
    stream: TcpStream,
    sealer: Option<Sealer>,
    frame: Vec<u8>,
}

/// A connected, authenticated peer connection as [`connect_mesh`] returns it.
pub(crate) struct Link {
    pub stream: TcpStream,
    /// What both ends saw in the handshake (keys for sealed frames are derived from it).
    transcript: Transcript,
    /// This end dialed (the lower node id dials).
    dialed: bool,
}

/// One node's TCP transport.
pub struct TcpTransport {
    node: u8,
    nodes: u8,
    cluster_id: u64,
    region: Arc<Region>,
    peers: Vec<Option<Peer>>,
    closed: AtomicBool,
}

fn hello(magic: [u8; 4], cluster_id: u64, from: u8, to: u8) -> [u8; HELLO] {
    let mut b = [0u8; HELLO];
    b[0..4].copy_from_slice(&magic);
    b[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    b[6] = from;
    b[7] = to;
    b[8..16].copy_from_slice(&cluster_id.to_le_bytes());
    b
}

/// One side's proof for a handshake: HMAC-SHA256 under the cluster secret of the role and both
/// sides' hellos and nonces.
fn proof(
    secret: &[u8],
    role: &[u8],
    dialer: (&[u8; HELLO], &[u8; NONCE]),
    acceptor: (&[u8; HELLO], &[u8; NONCE]),
) -> hmac::Hmac<sha2::Sha256> {
    use hmac::Mac;
    let mut m = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(secret)
        .expect("HMAC takes keys of any length");
    m.update(role);
    m.update(dialer.0);
    m.update(dialer.1);
    m.update(acceptor.0);
    m.update(acceptor.1);
    m
}

const ACCEPTOR: &[u8] = b"shoal tcp acceptor";

fn transcript(
    dialer: (&[u8; HELLO], &[u8; NONCE]),
    acceptor: (&[u8; HELLO], &[u8; NONCE]),
) -> Transcript {
    Transcript([&dialer.0[..], dialer.1, acceptor.0, acceptor.1].concat())
}

/// A fresh handshake nonce from the operating system's random source.
fn nonce() -> Result<[u8; NONCE], String> {
    use rand::{RngCore, SeedableRng};
    let mut rng = rand::rngs::StdRng::try_from_os_rng()
        .map_err(|e| format!("no random nonce for the handshake: {e}"))?;
    let mut b = [0u8; NONCE];
    rng.fill_bytes(&mut b);
    Ok(b)
}
const DIALER: &[u8] = b"shoal tcp dialer";

fn make_proof(
    secret: &[u8],
    role: &[u8],
    dialer: (&[u8; HELLO], &[u8; NONCE]),
    acceptor: (&[u8; HELLO], &[u8; NONCE]),
) -> [u8; PROOF] {
    use hmac::Mac;
    proof(secret, role, dialer, acceptor)
        .finalize()
        .into_bytes()
        .into()
}

/// Whether `got` is the proof for these hellos and nonces (compared in constant time).
fn proof_ok(
    secret: &[u8],
    role: &[u8],
    dialer: (&[u8; HELLO], &[u8; NONCE]),
    acceptor: (&[u8; HELLO], &[u8; NONCE]),
    got: &[u8],
) -> bool {
    use hmac::Mac;
    proof(secret, role, dialer, acceptor)
        .verify_slice(got)
        .is_ok()
}

/// The dialing side of a handshake on a connected stream: hello and nonce out; the acceptor's
/// hello, nonce and proof back (checked); our proof out; the acceptor's one-byte welcome back.
/// Public for tests and tools that must speak the wire protocol as a node would.
pub fn dial_handshake(
    s: &mut TcpStream,
    cluster_id: u64,
    me: u8,
    peer: u8,
    nodes: u8,
    secret: &[u8],
) -> Result<(), String> {
    handshake_dial(s, MAGIC, cluster_id, me, peer, nodes, secret).map(|_| ())
}

fn handshake_dial(
    s: &mut TcpStream,
    magic: [u8; 4],
    cluster: u64,
    me: u8,
    peer: u8,
    nodes: u8,
    secret: &[u8],
) -> Result<Transcript, String> {
    let hd = hello(magic, cluster, me, peer);
    let nd = nonce()?;
    let mut out = [0u8; HELLO + NONCE];
    out[..HELLO].copy_from_slice(&hd);
    out[HELLO..].copy_from_slice(&nd);
    s.write_all(&out).map_err(|e| e.to_string())?;
    let closed = |e: std::io::Error, what: &str| match e.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe => format!(
            "node {peer} closed the connection {what}: it refused this node (another cluster \
             id, secret or encryption setting, a node {me} it already has, or not a shoal node \
             at that address; see its log)"
        ),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            format!("node {peer} accepted the connection but never answered")
        }
        _ => format!("no handshake reply from node {peer}: {e}"),
    };
    let mut back = [0u8; HELLO + NONCE + PROOF];
    s.read_exact(&mut back)
        .map_err(|e| closed(e, "instead of answering"))?;
    let ha: [u8; HELLO] = back[..HELLO].try_into().expect("hello bytes");
    let na: [u8; NONCE] = back[HELLO..HELLO + NONCE].try_into().expect("nonce bytes");
    let from = check_hello(&ha, magic, cluster, me, nodes)?;
    if from != peer {
        return Err(format!("expected node {peer}, node {from} answered"));
    }
    if !proof_ok(
        secret,
        ACCEPTOR,
        (&hd, &nd),
        (&ha, &na),
        &back[HELLO + NONCE..],
    ) {
        return Err(format!(
            "node {peer} could not prove it knows the cluster secret (bad credentials: the \
             secrets differ, or another process answers at its address)"
        ));
    }
    s.write_all(&make_proof(secret, DIALER, (&hd, &nd), (&ha, &na)))
        .map_err(|e| e.to_string())?;
    let mut welcome = [0u8; 1];
    s.read_exact(&mut welcome)
        .map_err(|e| closed(e, "after this node's proof"))?;
    Ok(transcript((&hd, &nd), (&ha, &na)))
}

/// Check a peer's hello; returns the sender node.
fn check_hello(
    b: &[u8; HELLO],
    magic: [u8; 4],
    cluster_id: u64,
    me: u8,
    nodes: u8,
) -> Result<u8, String> {
    if b[0..4] != magic {
        let sealed = |m: &[u8]| m == SEALED_MAGIC;
        if [MAGIC, SEALED_MAGIC].iter().any(|m| b[0..4] == m[..])
            && [MAGIC, SEALED_MAGIC].contains(&magic)
        {
            return Err(format!(
                "the peer {} its frames and this node {}: set `encrypt` the same in every \
                 node's cluster file",
                if sealed(&b[0..4]) {
                    "encrypts"
                } else {
                    "does not encrypt"
                },
                if sealed(&magic) { "does" } else { "does not" }
            ));
        }
        return Err(format!(
            "not a Shoal peer of this transport (magic {:?}, expected {:?})",
            String::from_utf8_lossy(&b[0..4]),
            String::from_utf8_lossy(&magic)
        ));
    }
    let v = u16::from_le_bytes([b[4], b[5]]);
    if v != PROTOCOL_VERSION {
        return Err(format!(
            "protocol version {v}, this node speaks {PROTOCOL_VERSION}"
        ));
    }
    let c = LittleEndian::read_u64(&b[8..]);
    if c != cluster_id {
        return Err(format!(
            "cluster id {c}, this node is in cluster {cluster_id}"
        ));
    }
    if b[7] != me {
        return Err(format!("addressed to node {}, this is node {me}", b[7]));
    }
    if b[6] >= nodes || b[6] == me {
        return Err(format!("sender node {} is not a peer", b[6]));
    }
    Ok(b[6])
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
        let mut links = connect_mesh(&cfg, listener, magic)?;
        let nodes = links.len() as u8;
        let mut peers = Vec::with_capacity(nodes as usize);
        let mut openers = Vec::with_capacity(nodes as usize);
        for (i, l) in links.drain(..).enumerate() {
            peers.push(match l {
                None if i == cfg.node as usize => None,
                None => return Err(MsgError::PeerDead(i as u8)),
                Some(l) => {
                    l.stream.set_read_timeout(None).map_err(io)?;
                    let (sealer, opener) = if cfg.encrypt {
                        let k = seal::keys(&cfg.secret, &l.transcript, l.dialed);
                        (Some(k.send), Some(k.recv))
                    } else {
                        (None, None)
                    };
                    openers.push(opener);
                    Some(Peer {
                        addr: cfg.addrs[i],
                        writer: Mutex::new(Writer {
                            stream: l.stream.try_clone().map_err(io)?,
                            sealer,
                            frame: Vec::new(),
                        }),
                        stream: l.stream,
                        alive: AtomicBool::new(true),
                    })
                }
            });
        }
        let mut openers = openers.into_iter();
        let t = Arc::new(TcpTransport {
            node: cfg.node,
            nodes,
            cluster_id: cfg.cluster_id,
            region,
            peers,
            closed: AtomicBool::new(false),
        });
        for (i, p) in t.peers.iter().enumerate() {
            if let Some(p) = p {
                let reader = p.stream.try_clone().map_err(io)?;
                let opener = openers.next().expect("an opener slot per peer");
                let t2 = Arc::clone(&t);
                std::thread::Builder::new()
                    .name(format!("shoal-tcp-rx-{}-{i}", cfg.node))
                    .spawn(move || t2.receive(i as u8, reader, opener))
                    .map_err(io)?;
            }
        }
        Ok(t)
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

    /// Apply `peer`'s frames in order until the connection closes or a frame is bad.
    fn receive(&self, peer: u8, mut s: TcpStream, opener: Option<Opener>) {
        let why = match opener {
            None => self.receive_plain(&mut s),
            Some(o) => self.receive_sealed(peer, &mut s, o),
        };
        if !self.closed.load(Ordering::Acquire) {
            log::error!("node {}: dropping node {peer}: {why}", self.node);
        }
        self.mark_dead(peer);
    }

    /// Plain frames; returns why the connection ended.
    fn receive_plain(&self, s: &mut TcpStream) -> String {
        let mut head = [0u8; HEADER];
        let mut buf = Vec::new();
        loop {
            if let Err(e) = s.read_exact(&mut head) {
                return format!("connection closed ({e})");
            }
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
    fn receive_sealed(&self, peer: u8, s: &mut TcpStream, mut opener: Opener) -> String {
        let mut len = [0u8; seal::LEN];
        let mut buf = Vec::new();
        loop {
            if let Err(e) = s.read_exact(&mut len) {
                return format!("connection closed ({e})");
            }
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
    fn mark_dead(&self, peer: u8) {
        if let Some(Some(p)) = self.peers.get(peer as usize) {
            p.alive.store(false, Ordering::Release);
            let _ = p.stream.shutdown(Shutdown::Both);
        }
        self.region.wake_all();
    }

    /// Close every connection (peers see this node die).
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        for p in self.peers.iter().flatten() {
            p.alive.store(false, Ordering::Release);
            let _ = p.stream.shutdown(Shutdown::Both);
        }
        self.region.wake_all();
    }
}

impl Transport for TcpTransport {
    fn sever(&self, peer: u8) {
        self.mark_dead(peer); // closes the connection: the peer sees this node die
    }
    fn departing(&self) {
        self.closed.store(true, Ordering::Release);
    }
    fn leave(&self, linger: Duration) {
        self.closed.store(true, Ordering::Release);
        // FIN after everything written; keep reading so peers' last writes still land
        for p in self.peers.iter().flatten() {
            let _ = p.stream.shutdown(Shutdown::Write);
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
        let p = match self.peers.get(peer as usize) {
            Some(Some(p)) => p,
            _ => return Err(MsgError::NoSuchPeer(peer, self.nodes)),
        };
        if !p.alive.load(Ordering::Acquire) {
            return Err(MsgError::PeerDead(peer));
        }
        if data.len() > MAX_FRAME
            || data.is_empty()
            || !data.len().is_multiple_of(8)
            || !offset.is_multiple_of(8)
        {
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
                sealer,
                frame,
            } = &mut *w;
            frame.clear();
            if sealer.is_some() {
                frame.extend_from_slice(&[0u8; seal::LEN]);
            }
            frame.extend_from_slice(&(offset as u64).to_le_bytes());
            frame.extend_from_slice(&(data.len() as u32).to_le_bytes());
            frame.extend_from_slice(&[0u8; 4]);
            frame.extend_from_slice(data);
            if let Some(sealer) = sealer {
                sealer.seal(frame);
            }
            let r = stream.write_all(frame);
            if frame.capacity() > 2 * (HEADER + crate::PAGE_BYTES + seal::LEN + seal::TAG) {
                *frame = Vec::new(); // do not keep a large frame's buffer
            }
            r
        };
        r.map_err(|e| {
            log::error!(
                "node {}: writing to node {peer} at {}: {e}",
                self.node,
                p.addr
            );
            self.mark_dead(peer);
            MsgError::PeerDead(peer)
        })
    }
    fn peer_alive(&self, peer: u8) -> bool {
        peer == self.node
            || matches!(self.peers.get(peer as usize), Some(Some(p)) if p.alive.load(Ordering::Acquire))
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

/// `n` loopback addresses (127.0.0.1) whose ports are free now, for a cluster of processes
/// on one host (tests, `shoal ycsb --transport tcp`). The ports lie below the kernel's
/// ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`) when there is room, so no
/// outgoing connection on the host can take one between now and the moment its node binds
/// it; successive calls in one process never return a port twice. Falls back to ports the
/// kernel picks when the ephemeral range leaves no room below it.
pub fn free_loopback_addrs(n: usize) -> std::io::Result<Vec<SocketAddr>> {
    use std::sync::atomic::AtomicU32;
    /// Lowest port handed out (well above the ports of common services).
    const LOW: u32 = 10_000;
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
/// `tcp` node and an `rdma` node never pair up). Afterwards a thread keeps refusing strangers on
/// the listener. Returns one link per node (`None` at this node's own index).
pub(crate) fn connect_mesh(
    cfg: &TcpConfig,
    listener: TcpListener,
    magic: [u8; 4],
) -> Result<Vec<Option<Link>>, MsgError> {
    let nodes = cfg.addrs.len();
    if nodes == 0 || nodes > 64 || cfg.node as usize >= nodes {
        return Err(MsgError::Config(format!(
            "node {} in a cluster of {nodes} addresses (1 to 64 nodes)",
            cfg.node
        )));
    }
    let nodes = nodes as u8;
    let deadline = Instant::now() + cfg.connect_timeout;
    let mut streams: Vec<Option<Link>> = (0..nodes).map(|_| None).collect();
    // accept lower ids in the background while dialing higher ids
    let expect_lower = cfg.node as usize;
    let acceptor = {
        let listener = listener.try_clone().map_err(io)?;
        let (cluster, me) = (cfg.cluster_id, cfg.node);
        let secret: Arc<[u8]> = cfg.secret.clone().into();
        std::thread::Builder::new()
            .name(format!("shoal-tcp-accept-{me}"))
            .spawn(move || {
                let who = Who {
                    magic,
                    cluster,
                    me,
                    nodes,
                    secret,
                };
                accept_peers(listener, who, expect_lower, deadline)
            })
            .map_err(io)?
    };
    for peer in cfg.node + 1..nodes {
        let addr = cfg.addrs[peer as usize];
        let (stream, transcript) = dial(
            addr,
            magic,
            cfg.cluster_id,
            cfg.node,
            peer,
            nodes,
            deadline,
            &cfg.secret,
        )?;
        streams[peer as usize] = Some(Link {
            stream,
            transcript,
            dialed: true,
        });
    }
    let accepted = acceptor
        .join()
        .map_err(|_| MsgError::Io("acceptor thread panicked".into()))??;
    for (peer, stream, transcript) in accepted {
        streams[peer as usize] = Some(Link {
            stream,
            transcript,
            dialed: false,
        });
    }
    // keep rejecting strangers on the listener for the life of the process
    std::thread::Builder::new()
        .name(format!("shoal-tcp-reject-{}", cfg.node))
        .spawn({
            let me = cfg.node;
            move || reject_strangers(listener, me)
        })
        .map_err(io)?;
    Ok(streams)
}

#[allow(clippy::too_many_arguments)]
fn dial(
    addr: SocketAddr,
    magic: [u8; 4],
    cluster: u64,
    me: u8,
    peer: u8,
    nodes: u8,
    deadline: Instant,
    secret: &[u8],
) -> Result<(TcpStream, Transcript), MsgError> {
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
                let t =
                    handshake_dial(&mut s, magic, cluster, me, peer, nodes, secret).map_err(hs)?;
                s.set_read_timeout(None).map_err(io)?;
                return Ok((s, t));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)), // not listening yet
        }
    }
}

/// How long a connection may take to send its hello before the acceptor gives up on it.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections whose hello is awaited at once. While that many are pending, the acceptor
/// takes no more: further connections wait in the listen backlog (a real peer's hello with
/// them) until a slot frees, which takes at most [`HANDSHAKE_TIMEOUT`].
const MAX_PENDING_HANDSHAKES: usize = 32;
/// At most one log line per this interval for refused connections (with a count).
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(5);

/// Refused connections, logged at most once per [`REFUSAL_LOG_EVERY`] with how many there were
/// since the last line (a stranger that keeps reconnecting must not flood the log).
struct RefusalLog {
    me: u8,
    since: Option<Instant>,
    unlogged: u64,
}

impl RefusalLog {
    fn new(me: u8) -> RefusalLog {
        RefusalLog {
            me,
            since: None,
            unlogged: 0,
        }
    }

    /// Count a refusal; returns whether a line was logged for it.
    fn refused(&mut self, from: Option<SocketAddr>, why: &str) -> bool {
        self.unlogged += 1;
        let due = self.since.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_EVERY);
        if due {
            let more = match self.unlogged {
                1 => String::new(),
                n => format!(" ({} more refused since the last report)", n - 1),
            };
            log::error!(
                "node {}: refusing a connection from {}: {why}{more}",
                self.me,
                from.map_or("?".to_string(), |a| a.to_string())
            );
            self.since = Some(Instant::now());
            self.unlogged = 0;
        }
        due
    }
}

/// What an acceptor checks a connecting node against.
struct Who {
    magic: [u8; 4],
    cluster: u64,
    me: u8,
    nodes: u8,
    secret: Arc<[u8]>,
}

/// The accepting side of a handshake (at most [`HANDSHAKE_TIMEOUT`] per read, or until
/// `deadline`): the dialer's hello and nonce in (checked); our hello, nonce and proof out; the
/// dialer's proof in (checked). Returns the node the dialer proved to be and the transcript;
/// the caller sends the one-byte welcome once it keeps the connection.
fn handshake_accept(
    s: &mut TcpStream,
    who: &Who,
    deadline: Instant,
) -> Result<(u8, Transcript), String> {
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_read_timeout(Some(
        HANDSHAKE_TIMEOUT.min(left).max(Duration::from_millis(10)),
    ))
    .map_err(|e| e.to_string())?;
    let silent = |e: std::io::Error, what: &str| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            format!("no {what} in time")
        }
        _ => format!("no {what}: {e}"),
    };
    let mut first = [0u8; HELLO + NONCE];
    s.read_exact(&mut first).map_err(|e| silent(e, "hello"))?;
    let hd: [u8; HELLO] = first[..HELLO].try_into().expect("hello bytes");
    let nd: [u8; NONCE] = first[HELLO..].try_into().expect("nonce bytes");
    let from = check_hello(&hd, who.magic, who.cluster, who.me, who.nodes)?;
    let ha = hello(who.magic, who.cluster, who.me, from);
    let na = nonce()?;
    let mut out = [0u8; HELLO + NONCE + PROOF];
    out[..HELLO].copy_from_slice(&ha);
    out[HELLO..HELLO + NONCE].copy_from_slice(&na);
    out[HELLO + NONCE..].copy_from_slice(&make_proof(
        &who.secret,
        ACCEPTOR,
        (&hd, &nd),
        (&ha, &na),
    ));
    s.write_all(&out).map_err(|e| e.to_string())?;
    let mut got = [0u8; PROOF];
    s.read_exact(&mut got).map_err(|e| silent(e, "proof"))?;
    if !proof_ok(&who.secret, DIALER, (&hd, &nd), (&ha, &na), &got) {
        return Err(format!(
            "it says it is node {from} but cannot prove it knows the cluster secret (bad \
             credentials)"
        ));
    }
    Ok((from, transcript((&hd, &nd), (&ha, &na))))
}

/// Accept the `expect` lower-numbered peers. Each connection's hello is read on a thread of
/// its own (at most [`MAX_PENDING_HANDSHAKES`] at once, each for at most
/// [`HANDSHAKE_TIMEOUT`]), so idle or slow connections cannot hold up the real peers (issue
/// 29: ten idle connections used to fail a start-up, one 5 s read at a time).
fn accept_peers(
    listener: TcpListener,
    who: Who,
    expect: usize,
    deadline: Instant,
) -> Result<Vec<(u8, TcpStream, Transcript)>, MsgError> {
    let me = who.me;
    let who = Arc::new(who);
    type Checked = (
        Option<SocketAddr>,
        TcpStream,
        Result<(u8, Transcript), String>,
    );
    let mut got: Vec<(u8, TcpStream, Transcript)> = Vec::new();
    let mut log = RefusalLog::new(me);
    let (tx, rx) = std::sync::mpsc::channel::<Checked>();
    let mut pending = 0usize;
    listener.set_nonblocking(true).map_err(io)?;
    while got.len() < expect {
        if Instant::now() >= deadline {
            let missing: Vec<usize> = (0..expect)
                .filter(|p| !got.iter().any(|(g, _, _)| *g as usize == *p))
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
            let r = r.and_then(|(from, t)| {
                if from as usize >= expect || got.iter().any(|(g, _, _)| *g == from) {
                    return Err(format!("unexpected connection from node {from}"));
                }
                s.set_read_timeout(None).map_err(|e| e.to_string())?;
                s.write_all(&[1]).map_err(|e| e.to_string())?; // welcome
                Ok((from, t))
            });
            match r {
                Ok((from, t)) => got.push((from, s, t)),
                Err(why) => {
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

fn reject_strangers(listener: TcpListener, me: u8) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handshake_proof_verifies_only_with_the_same_secret_and_nonces() {
        let hd = hello(MAGIC, 7, 0, 1);
        let ha = hello(MAGIC, 7, 1, 0);
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
        let h = hello(MAGIC, 7, 0, 1);
        assert_eq!(check_hello(&h, MAGIC, 7, 1, 2), Ok(0));
        assert!(check_hello(&h, MAGIC, 8, 1, 2)
            .unwrap_err()
            .contains("cluster id"));
        assert!(check_hello(&h, MAGIC, 7, 2, 3)
            .unwrap_err()
            .contains("addressed to node 1"));
        assert!(check_hello(&hello(MAGIC, 7, 5, 1), MAGIC, 7, 1, 2)
            .unwrap_err()
            .contains("not a peer"));
        let mut bad = h;
        bad[0] = b'X';
        assert!(check_hello(&bad, MAGIC, 7, 1, 2)
            .unwrap_err()
            .contains("magic"));
        let mut v = h;
        v[4] = 9;
        assert!(check_hello(&v, MAGIC, 7, 1, 2)
            .unwrap_err()
            .contains("version"));
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
