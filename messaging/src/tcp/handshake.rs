//! The handshake of a tcp connection: hellos naming cluster and nodes, fresh nonces, and
//! HMAC-SHA256 proofs that both ends know the cluster secret; the checks of each side.

use super::*;

/// A hello: magic, protocol version, sender and receiver node, cluster id, the sender's
/// incarnation (which start of its process this is, see [`TcpConfig::incarnation`]), and the
/// version of the messages its layer above sends ([`TcpConfig::messages_version`]), a flags
/// byte (bit 0, [`TAKING_BACK`]: the sender runs and takes the receiver back as a restarted
/// node); 5 bytes reserved (zero, not checked).
pub(super) fn hello(ends: &Ends, to: u8) -> [u8; HELLO] {
    let mut b = [0u8; HELLO];
    b[0..4].copy_from_slice(&ends.magic);
    b[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    b[6] = ends.me;
    b[7] = to;
    b[8..16].copy_from_slice(&ends.cluster.to_le_bytes());
    b[16..24].copy_from_slice(&ends.incarnation.to_le_bytes());
    b[24..26].copy_from_slice(&ends.messages.to_le_bytes());
    b[26] = if ends.taking_back { TAKING_BACK } else { 0 };
    b
}

/// Hello flag: the sender is a running node taking the receiver back (`rejoin.rs`).
pub(super) const TAKING_BACK: u8 = 1;

/// One side's proof for a handshake: HMAC-SHA256 under the cluster secret of the role and both
/// sides' hellos and nonces.
pub(super) fn proof(
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

pub(super) const ACCEPTOR: &[u8] = b"shoal tcp acceptor";

pub(super) fn transcript(
    dialer: (&[u8; HELLO], &[u8; NONCE]),
    acceptor: (&[u8; HELLO], &[u8; NONCE]),
) -> Transcript {
    Transcript([&dialer.0[..], dialer.1, acceptor.0, acceptor.1].concat())
}

/// A fresh handshake nonce from the operating system's random source.
pub(super) fn nonce() -> Result<[u8; NONCE], String> {
    use rand::{RngCore, SeedableRng};
    let mut rng = rand::rngs::StdRng::try_from_os_rng()
        .map_err(|e| format!("no random nonce for the handshake: {e}"))?;
    let mut b = [0u8; NONCE];
    rng.fill_bytes(&mut b);
    Ok(b)
}

pub(super) const DIALER: &[u8] = b"shoal tcp dialer";

pub(super) fn make_proof(
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
pub(super) fn proof_ok(
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
/// Public for tests and tools that must speak the wire protocol as a node would (with an
/// incarnation of now, as a node that just started).
pub fn dial_handshake(
    s: &mut TcpStream,
    cluster_id: u64,
    me: u8,
    peer: u8,
    nodes: u8,
    secret: &[u8],
) -> Result<(), String> {
    let ends = Ends {
        magic: MAGIC,
        cluster: cluster_id,
        me,
        nodes,
        incarnation: incarnation_now(),
        messages: 0,
        taking_back: false,
    };
    handshake_dial(s, &ends, peer, secret).map(|_| ())
}

/// What this end says of itself in a hello, and checks the other end's hello against.
#[derive(Clone, Copy)]
pub(super) struct Ends {
    pub(super) magic: [u8; 4],
    pub(super) cluster: u64,
    pub(super) me: u8,
    pub(super) nodes: u8,
    pub(super) incarnation: u64,
    /// [`TcpConfig::messages_version`].
    pub(super) messages: u16,
    /// This end runs and takes the other end back as a restarted node (hello flag
    /// [`TAKING_BACK`]).
    pub(super) taking_back: bool,
}

/// The other end of a finished handshake: who it proved to be, which incarnation of it, and
/// what both ends saw.
pub(super) struct Met {
    pub(super) node: u8,
    pub(super) incarnation: u64,
    /// The other end runs and took this node back (it restarted into a running cluster).
    pub(super) taking_back: bool,
    pub(super) transcript: Transcript,
}

/// The dialing side's handshake with `peer` (see [`dial_handshake`]).
pub(super) fn handshake_dial(
    s: &mut TcpStream,
    ends: &Ends,
    peer: u8,
    secret: &[u8],
) -> Result<Met, String> {
    handshake_dial_then(s, ends, peer, secret, |_| Ok(()))
}

/// [`handshake_dial`], running `before_verdict` with the acceptor's incarnation once its
/// hello and proof are checked and this side's proof went, before this side's verdict (after
/// a yes, the acceptor welcomes the connection and counts it): an error there refuses the
/// acceptor, which is told why.
pub(super) fn handshake_dial_then(
    s: &mut TcpStream,
    ends: &Ends,
    peer: u8,
    secret: &[u8],
    before_verdict: impl FnOnce(u64) -> Result<(), String>,
) -> Result<Met, String> {
    let me = ends.me;
    let hd = hello(ends, peer);
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
             id, secret, encryption setting or Shoal version, a node {me} it already has, a \
             restarted node {me} that the running cluster does not take back, or not a shoal \
             node at that address; see its log)"
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
    let (from, incarnation) = check_hello(&ha, ends)?;
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
    if let Err(why) = before_verdict(incarnation) {
        let _ = refuse(s, &why);
        return Err(why);
    }
    s.write_all(&[WELCOME]).map_err(|e| e.to_string())?;
    let mut welcome = [0u8; 1];
    s.read_exact(&mut welcome)
        .map_err(|e| closed(e, "after this node's proof"))?;
    if welcome[0] != WELCOME {
        let why = reason(s).map_err(|e| closed(e, "while refusing this node"))?;
        return Err(format!("node {peer} refused this node: {why}"));
    }
    Ok(Met {
        node: from,
        incarnation,
        taking_back: ha[26] & TAKING_BACK != 0,
        transcript: transcript((&hd, &nd), (&ha, &na)),
    })
}

/// Check a peer's hello against this end's `ends`; returns the sender node and its
/// incarnation.
pub(super) fn check_hello(b: &[u8; HELLO], ends: &Ends) -> Result<(u8, u64), String> {
    let Ends {
        magic,
        cluster: cluster_id,
        me,
        nodes,
        messages,
        ..
    } = *ends;
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
    let theirs = LittleEndian::read_u16(&b[24..]);
    if theirs != messages {
        return Err(format!(
            "node {} sends messages of version {theirs}, this node's are of version \
             {messages}: run the same version of Shoal on every node",
            b[6]
        ));
    }
    Ok((b[6], LittleEndian::read_u64(&b[16..])))
}

/// The last byte of each side of a handshake (the dialer's after its proof, the acceptor's
/// after that): it keeps the connection. A proven side that does not ends its handshake with
/// [`REFUSED`] and why ([`refuse`]), so the other side can say why it was refused.
pub(super) const WELCOME: u8 = 1;
/// See [`WELCOME`].
pub(super) const REFUSED: u8 = 0;
/// Longest reason a refusal carries (bytes of UTF-8; longer ones are cut).
const MAX_REASON: usize = 1024;

/// End a proven handshake by refusing the other side: [`REFUSED`], then the reason (u16
/// length, UTF-8). Best effort: the connection is closed after it anyway.
pub(super) fn refuse(s: &mut TcpStream, why: &str) -> std::io::Result<()> {
    let mut n = why.len().min(MAX_REASON);
    while !why.is_char_boundary(n) {
        n -= 1;
    }
    let mut out = Vec::with_capacity(3 + n);
    out.push(REFUSED);
    out.extend_from_slice(&(n as u16).to_le_bytes());
    out.extend_from_slice(&why.as_bytes()[..n]);
    s.write_all(&out)
}

/// The reason of a refusal whose [`REFUSED`] byte was read.
fn reason(s: &mut TcpStream) -> std::io::Result<String> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len)?;
    let n = (u16::from_le_bytes(len) as usize).min(MAX_REASON);
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// Why an accepted connection's handshake did not finish.
pub(super) enum Unmet {
    /// Not a peer, not in time, not proven: the connection is dropped.
    Failed(String),
    /// A proven peer refused this node, saying why: it will not connect.
    Refused { node: u8, why: String },
}

impl From<String> for Unmet {
    fn from(why: String) -> Unmet {
        Unmet::Failed(why)
    }
}

impl std::fmt::Display for Unmet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unmet::Failed(why) => f.write_str(why),
            Unmet::Refused { node, why } => write!(f, "node {node} refused this node: {why}"),
        }
    }
}

/// How long a connection may take to send its hello before the acceptor gives up on it.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// Connections whose hello is awaited at once. While that many are pending, the acceptor
/// takes no more: further connections wait in the listen backlog (a real peer's hello with
/// them) until a slot frees, which takes at most [`HANDSHAKE_TIMEOUT`].
pub(super) const MAX_PENDING_HANDSHAKES: usize = 32;

/// At most one log line per this interval for refused connections (with a count).
pub(super) const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(5);

/// Refused connections, logged at most once per [`REFUSAL_LOG_EVERY`] with how many there were
/// since the last line (a stranger that keeps reconnecting must not flood the log).
pub(super) struct RefusalLog {
    pub(super) me: u8,
    pub(super) since: Option<Instant>,
    pub(super) unlogged: u64,
    /// What a line says happened: "refusing a connection from" (an acceptor), or "no
    /// connection to" (a node dialing a dead peer again, `rejoin.rs`).
    what: &'static str,
}

impl RefusalLog {
    pub(super) fn new(me: u8) -> RefusalLog {
        RefusalLog {
            me,
            since: None,
            unlogged: 0,
            what: "refusing a connection from",
        }
    }

    /// The log of a node dialing its dead peers again.
    pub(super) fn dialing(me: u8) -> RefusalLog {
        RefusalLog {
            what: "no connection to",
            ..RefusalLog::new(me)
        }
    }

    /// Count a refusal; returns whether a line was logged for it.
    pub(super) fn refused(&mut self, from: Option<SocketAddr>, why: &str) -> bool {
        self.unlogged += 1;
        let due = self.since.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_EVERY);
        if due {
            let more = match self.unlogged {
                1 => String::new(),
                n => format!(" ({} more refused since the last report)", n - 1),
            };
            log::error!(
                "node {}: {} {}: {why}{more}",
                self.me,
                self.what,
                from.map_or("?".to_string(), |a| a.to_string())
            );
            self.since = Some(Instant::now());
            self.unlogged = 0;
        }
        due
    }
}

/// What an acceptor checks a connecting node against.
pub(super) struct Who {
    pub(super) ends: Ends,
    pub(super) secret: Arc<[u8]>,
}

/// The accepting side of a handshake (at most [`HANDSHAKE_TIMEOUT`] per read, or until
/// `deadline`): the dialer's hello and nonce in (checked); our hello, nonce and proof out; the
/// dialer's proof in (checked); the dialer's verdict in (it may refuse this node, saying why;
/// waited for until `deadline`, as the dialer may first have to get ready for this node).
/// Returns who the dialer proved to be; the caller sends the one-byte welcome once it keeps
/// the connection (or refuses it: [`refuse`]).
pub(super) fn handshake_accept(
    s: &mut TcpStream,
    who: &Who,
    deadline: Instant,
) -> Result<Met, Unmet> {
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
    let (from, incarnation) = match check_hello(&hd, &who.ends) {
        Ok(x) => x,
        Err(why) => {
            // Only the messages' version differs (two builds of Shoal): answer with our
            // hello anyway, so that the dialer's error names both versions too.
            let mut same = hd;
            same[24..26].copy_from_slice(&who.ends.messages.to_le_bytes());
            if let Ok((from, _)) = check_hello(&same, &who.ends) {
                let mut out = [0u8; HELLO + NONCE + PROOF];
                out[..HELLO].copy_from_slice(&hello(&who.ends, from));
                let _ = s.write_all(&out);
            }
            return Err(why.into());
        }
    };
    let ha = hello(&who.ends, from);
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
        )
        .into());
    }
    // a proven peer: its verdict may take it a while (a running node readying itself for a
    // restarted one)
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_read_timeout(Some(left.max(Duration::from_millis(10))))
        .map_err(|e| e.to_string())?;
    let mut verdict = [0u8; 1];
    s.read_exact(&mut verdict)
        .map_err(|e| silent(e, "verdict"))?;
    match verdict[0] {
        WELCOME => {}
        REFUSED => {
            let why = reason(s).map_err(|e| silent(e, "reason for its refusal"))?;
            return Err(Unmet::Refused { node: from, why });
        }
        b => return Err(format!("node {from} sent verdict byte {b}").into()),
    }
    Ok(Met {
        node: from,
        incarnation,
        taking_back: hd[26] & TAKING_BACK != 0,
        transcript: transcript((&hd, &nd), (&ha, &na)),
    })
}

/// An incarnation for a process starting now: microseconds since the Unix epoch (a restarted
/// node's is larger than its last one's as long as the clock did not go back in between).
pub fn incarnation_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
