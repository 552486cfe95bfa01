//! Wire format of the coherence messages: a [`Msg`] about one page in one 64-byte channel
//! message (shoal-messaging's [`shoal_messaging::Envelope`] body of 55 bytes).
//!
//! A message that carries a page travels with the page as the channel's attachment; the
//! message itself only says that it has one ([`Attached`]). The sender's protocol data (its
//! frame index) and the receiver's (the bytes that arrived) are both mapped from and to that
//! with [`Msg::map_data`]: one message type on the wire, no placeholder fields.
//!
//! Body layout (little endian): `pid u64 | fields of the kind`, every byte a kind does not use
//! must be zero. Decoding rejects unknown kinds, modes and flags other than 0 or 1, node ids
//! of 64 and above, and non-zero padding, so a corrupt or foreign message is an error, never a
//! wrong protocol action.

use crate::coherence::directory::Holds;
use crate::coherence::protocol::{Grant, Mode, Msg, Node, NodeSet};
use byteorder::{ByteOrder, LittleEndian};
use shoal_messaging::{Message, MsgError, BODY_BYTES, PAGE_BYTES};

/// The page of a message travels as the channel's attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attached;

/// Version of the coherence messages on the wire, told in every tcp handshake
/// (`TcpConfig::messages_version`): nodes whose versions differ refuse each other with an
/// error that says so, instead of dropping each other's messages as malformed. Bump it with
/// every change to a message's layout or meaning (1: `Request` carries `again`; kinds 11 and
/// 12, `Reclaim` and `Gone`; 2: control kinds 44 and 45, `Found` and
/// `FoundAck`; 3: control kinds 46 to 49, `Ask`, `Has`, `Settle` and `Settled`).
pub const WIRE_VERSION: u16 = 3;

/// First message kind of the coherence protocol (kinds below belong to other protocols).
pub const KIND_BASE: u8 = 16;
const NO_NODE: u8 = 0xFF;

/// One coherence message as it travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wire {
    /// The page (raw page id).
    pub pid: u64,
    pub msg: Msg<Attached>,
}

impl Wire {
    /// The wire form of `msg` about page `pid` (whatever its page is, it travels attached).
    pub fn new<D: Clone>(pid: u64, msg: &Msg<D>) -> Wire {
        Wire {
            pid,
            msg: msg.clone().map_data(|_| Attached),
        }
    }
}

fn kind_of(m: &Msg<Attached>) -> u8 {
    KIND_BASE
        + match m {
            Msg::Request { .. } => 0,
            Msg::Grant(_) => 1,
            Msg::Transfer { .. } => 2,
            Msg::Page { .. } => 3,
            Msg::CopyBack { .. } => 4,
            Msg::Invalidate { .. } => 5,
            Msg::InvalidateAck => 6,
            Msg::Evict { .. } => 7,
            Msg::EvictReply { .. } => 8,
            Msg::Offer { .. } => 9,
            Msg::OfferReply { .. } => 10,
            Msg::Reclaim { .. } => 11,
            Msg::Gone => 12,
        }
}

fn mode_byte(m: Mode) -> u8 {
    match m {
        Mode::Shared => 0,
        Mode::Exclusive => 1,
    }
}

/// Writes fields after the 12-byte header.
struct W<'a> {
    b: &'a mut [u8; BODY_BYTES],
    at: usize,
}

impl W<'_> {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.b[self.at] = v;
        self.at += 1;
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.b[self.at..self.at + 4].copy_from_slice(&v.to_le_bytes());
        self.at += 4;
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.b[self.at..self.at + 8].copy_from_slice(&v.to_le_bytes());
        self.at += 8;
        self
    }
    fn opt_page(&mut self, p: Option<Attached>) -> &mut Self {
        self.u8(p.is_some() as u8)
    }
}

/// Reads fields after the 12-byte header, validating as it goes.
struct R<'a> {
    b: &'a [u8; BODY_BYTES],
    at: usize,
}

fn bad(what: String) -> MsgError {
    MsgError::Decode(what)
}

impl R<'_> {
    fn u8(&mut self) -> u8 {
        let v = self.b[self.at];
        self.at += 1;
        v
    }
    fn u32(&mut self) -> u32 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&self.b[self.at..self.at + 4]);
        self.at += 4;
        u32::from_le_bytes(w)
    }
    fn u64(&mut self) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&self.b[self.at..self.at + 8]);
        self.at += 8;
        u64::from_le_bytes(w)
    }
    fn flag(&mut self, what: &str) -> Result<bool, MsgError> {
        match self.u8() {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(bad(format!("{what} flag is {v}, not 0 or 1"))),
        }
    }
    fn mode(&mut self) -> Result<Mode, MsgError> {
        match self.u8() {
            0 => Ok(Mode::Shared),
            1 => Ok(Mode::Exclusive),
            v => Err(bad(format!("possession mode {v} does not exist"))),
        }
    }
    fn opt_page(&mut self) -> Result<Option<Attached>, MsgError> {
        Ok(self.flag("page")?.then_some(Attached))
    }
    fn node(&mut self) -> Result<Option<Node>, MsgError> {
        match self.u8() {
            NO_NODE => Ok(None),
            n if n < 64 => Ok(Some(n)),
            n => Err(bad(format!("node id {n} is not below 64"))),
        }
    }
    /// Everything after the fields must be zero.
    fn end(&self) -> Result<(), MsgError> {
        match self.b[self.at..].iter().position(|&x| x != 0) {
            None => Ok(()),
            Some(i) => Err(bad(format!(
                "non-zero padding at body byte {}",
                self.at + i
            ))),
        }
    }
}

impl Message for Wire {
    fn kind(&self) -> u8 {
        kind_of(&self.msg)
    }

    fn encode(&self, b: &mut [u8; BODY_BYTES]) {
        b.fill(0);
        let mut w = W { b, at: 0 };
        w.u64(self.pid);
        match &self.msg {
            Msg::Request { want, have, again } => {
                w.u8(mode_byte(*want)).u8(*have as u8).u8(*again as u8);
            }
            Msg::Grant(g) => {
                w.u8(mode_byte(g.mode))
                    .u64(g.epoch)
                    .opt_page(g.data)
                    .u8(g.source.unwrap_or(NO_NODE))
                    .u64(g.invalidate)
                    .u8(g.source_keeps as u8);
            }
            Msg::Transfer { want, epoch, keep } => {
                w.u8(mode_byte(*want)).u64(*epoch).u8(*keep as u8);
            }
            Msg::Page {
                data: Attached,
                dirty,
            } => {
                w.u8(*dirty as u8);
            }
            Msg::CopyBack { data } => {
                w.opt_page(*data);
            }
            Msg::Invalidate { epoch } => {
                w.u64(*epoch);
            }
            Msg::InvalidateAck => {}
            Msg::Evict { epoch, data } => {
                w.u64(*epoch).opt_page(*data);
            }
            Msg::EvictReply { accepted } => {
                w.u8(*accepted as u8);
            }
            // the page is always attached
            Msg::Offer { epoch, data: _ } => {
                w.u64(*epoch);
            }
            Msg::OfferReply { accepted } => {
                w.u8(*accepted as u8);
            }
            Msg::Reclaim { epoch } => {
                w.u64(*epoch);
            }
            Msg::Gone => {}
        }
    }

    fn decode(kind: u8, b: &[u8; BODY_BYTES]) -> Result<Self, MsgError> {
        let mut r = R { b, at: 0 };
        let pid = r.u64();
        let k = kind.checked_sub(KIND_BASE).unwrap_or(u8::MAX);
        let msg = match k {
            0 => Msg::Request {
                want: r.mode()?,
                have: r.flag("have")?,
                again: r.flag("again")?,
            },
            1 => {
                let mode = r.mode()?;
                let epoch = r.u64();
                let data = r.opt_page()?;
                let source = r.node()?;
                let invalidate: NodeSet = r.u64();
                let source_keeps = r.flag("source_keeps")?;
                if source.is_some_and(|s| invalidate & (1u64 << s) != 0) {
                    return Err(bad(
                        "a grant's source is also in its invalidation set".into()
                    ));
                }
                if source_keeps && (source.is_none() || mode != Mode::Shared || invalidate != 0) {
                    return Err(bad(
                        "a forwarded grant must be shared, name a source and invalidate nobody"
                            .into(),
                    ));
                }
                Msg::Grant(Grant {
                    mode,
                    epoch,
                    data,
                    source,
                    invalidate,
                    source_keeps,
                })
            }
            2 => {
                let want = r.mode()?;
                let epoch = r.u64();
                let keep = r.flag("keep")?;
                if keep && want != Mode::Shared {
                    return Err(bad(
                        "a transfer that keeps the source's copy must be shared".into(),
                    ));
                }
                Msg::Transfer { want, epoch, keep }
            }
            3 => Msg::Page {
                data: Attached,
                dirty: r.flag("dirty")?,
            },
            4 => Msg::CopyBack {
                data: r.opt_page()?,
            },
            5 => Msg::Invalidate { epoch: r.u64() },
            6 => Msg::InvalidateAck,
            7 => Msg::Evict {
                epoch: r.u64(),
                data: r.opt_page()?,
            },
            8 => Msg::EvictReply {
                accepted: r.flag("accepted")?,
            },
            9 => Msg::Offer {
                epoch: r.u64(),
                data: Attached,
            },
            10 => Msg::OfferReply {
                accepted: r.flag("accepted")?,
            },
            11 => Msg::Reclaim { epoch: r.u64() },
            12 => Msg::Gone,
            _ => {
                return Err(bad(format!(
                    "message kind {kind} is not a coherence message"
                )))
            }
        };
        r.end()?;
        Ok(Wire { pid, msg })
    }
}

/// First message kind of the control messages (kinds below belong to the coherence protocol).
pub const CONTROL_BASE: u8 = 32;
/// [`Control::Refuse`] code: the page does not exist.
pub const REFUSE_NO_PAGE: u8 = 1;
/// [`Control::Refuse`] code: the home could not read the page from its store.
pub const REFUSE_READ: u8 = 2;
/// [`Control::Refuse`] code: the page's holder (or a node that must hand it over or drop a
/// copy) is unreachable; `node` names it.
pub const REFUSE_HOLDER_DEAD: u8 = 3;

/// Messages beside the protocol's own: answers that end a request without a grant, the
/// cluster barrier, and allocation on another node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Home -> requester: the request for `pid` is refused (`code`: [`REFUSE_NO_PAGE`],
    /// [`REFUSE_READ`], [`REFUSE_HOLDER_DEAD`] with the dead `node`); the home recorded nothing.
    Refuse { pid: u64, code: u8, node: u8 },
    /// The sender reached barrier number `generation` (see `Engine::barrier`).
    Arrive { generation: u64 },
    /// Please allocate a page homed on the receiver; answer with [`Control::Allocated`]
    /// carrying the same `request` number.
    Alloc { request: u64 },
    /// Answer to [`Control::Alloc`]: the new page (zeroed, resident at its home), or
    /// [`Pid::NONE`](crate::pid::Pid::NONE)'s raw value when the store is full or failed.
    Allocated { request: u64, pid: u64 },
    /// To the home: the only current copy of `pid` was at `node`, which died before handing
    /// it over; the home refuses every later request for the page.
    Lost { pid: u64, node: u8 },
    /// From the home: `pid`, lost with a node that died, was brought back from the logs when
    /// that node restarted (`rejoin.rs`); a copy that lost it forgets the loss. Sent after
    /// every message the home sent before about the page (one connection keeps the order),
    /// which the loss still absorbs.
    Found { pid: u64 },
    /// Answer to [`Control::Found`]: the sender knows it may be listed as a sharer without a
    /// copy (`PageCopy::maybe_listed`); the home serves the page once every node it listed
    /// answered (`DirEntry::settling`).
    FoundAck { pid: u64 },
    /// From the home, at a restarted node's rejoin: what do you hold of `pid` (lost with the
    /// node that died)? Answered with [`Control::Has`] once every message the home sent
    /// before about the page is applied (`rejoin.rs`, the census of `DirEntry::counted`).
    Ask { pid: u64 },
    /// Answer to [`Control::Ask`]: `holds` is a [`Holds`] (0 nothing, 1 shared, 2
    /// exclusive, 3 busy).
    Has { pid: u64, holds: u8 },
    /// From a node about to take restarted `node` back: have you handled its old
    /// incarnation's death, as far as the asker's pages go? Answered with
    /// [`Control::Settled`] carrying the same `seq`, after every report about those pages
    /// (`Lost`, a request asking again) that the death made this node send (`rejoin.rs`).
    Settle { node: u8, seq: u64 },
    /// Answer to [`Control::Settle`]: `done` 1 if this node has handled the death (fenced,
    /// everything the dead node sent applied, no copy of the asker's pages waiting on it).
    Settled { node: u8, seq: u64, done: u8 },
    /// Several small coherence messages of the sender, in the order it sent them, packed into
    /// the attached page ([`encode_batch`]): eviction notices without a page and eviction
    /// replies. The receiver applies them as if they had arrived one by one, in that order.
    Batch { count: u16 },
    /// Requester -> home: the page [`Control::Allocated`] named came after the requester had
    /// given up waiting (its allocation failed with a timeout), so nobody knows its pid: the
    /// home frees it if it handed it out to the sender and no node ever asked for it.
    Unused { pid: u64 },
    /// One pool: every node tells the others, periodically, how many frames it could take
    /// in for them (free frames beyond its provider's target).
    Room { frames: u64 },
    /// A checkpointing node to a peer: make your log durable up to everything you logged so
    /// far (every page the sender handed you before this is logged by now), then answer with
    /// [`Control::LogFenced`] carrying the same `seq` (docs/durability.md, "Clusters").
    LogFence { seq: u64 },
    /// Answer to [`Control::LogFence`].
    LogFenced { seq: u64 },
    /// Every node to each live peer, periodically: `at` is when it left, on the sender's
    /// clock; answered with [`Control::Pong`] carrying the same `at` (the sender's lease,
    /// `lease.rs`).
    Ping { at: u64 },
    /// Answer to [`Control::Ping`].
    Pong { at: u64 },
}

impl Message for Control {
    fn kind(&self) -> u8 {
        match self {
            Control::Refuse { .. } => CONTROL_BASE,
            Control::Arrive { .. } => CONTROL_BASE + 1,
            Control::Alloc { .. } => CONTROL_BASE + 2,
            Control::Allocated { .. } => CONTROL_BASE + 3,
            Control::Lost { .. } => CONTROL_BASE + 4,
            Control::Batch { .. } => CONTROL_BASE + 5,
            Control::Unused { .. } => CONTROL_BASE + 6,
            Control::Room { .. } => CONTROL_BASE + 7,
            Control::LogFence { .. } => CONTROL_BASE + 8,
            Control::LogFenced { .. } => CONTROL_BASE + 9,
            Control::Ping { .. } => CONTROL_BASE + 10,
            Control::Pong { .. } => CONTROL_BASE + 11,
            Control::Found { .. } => CONTROL_BASE + 12,
            Control::FoundAck { .. } => CONTROL_BASE + 13,
            Control::Ask { .. } => CONTROL_BASE + 14,
            Control::Has { .. } => CONTROL_BASE + 15,
            Control::Settle { .. } => CONTROL_BASE + 16,
            Control::Settled { .. } => CONTROL_BASE + 17,
        }
    }

    fn encode(&self, b: &mut [u8; BODY_BYTES]) {
        b.fill(0);
        let mut w = W { b, at: 0 };
        match self {
            Control::Refuse { pid, code, node } => {
                w.u64(*pid).u8(*code).u8(*node);
            }
            Control::Arrive { generation } => {
                w.u64(*generation);
            }
            Control::Alloc { request } => {
                w.u64(*request);
            }
            Control::Allocated { request, pid } => {
                w.u64(*request).u64(*pid);
            }
            Control::Lost { pid, node } => {
                w.u64(*pid).u8(*node);
            }
            Control::Batch { count } => {
                w.u32(*count as u32);
            }
            Control::Unused { pid }
            | Control::Found { pid }
            | Control::FoundAck { pid }
            | Control::Ask { pid } => {
                w.u64(*pid);
            }
            Control::Has { pid, holds } => {
                w.u64(*pid).u8(*holds);
            }
            Control::Settle { node, seq } => {
                w.u8(*node).u64(*seq);
            }
            Control::Settled { node, seq, done } => {
                w.u8(*node).u64(*seq).u8(*done);
            }
            Control::Room { frames } => {
                w.u64(*frames);
            }
            Control::LogFence { seq } | Control::LogFenced { seq } => {
                w.u64(*seq);
            }
            Control::Ping { at } | Control::Pong { at } => {
                w.u64(*at);
            }
        }
    }

    fn decode(kind: u8, b: &[u8; BODY_BYTES]) -> Result<Self, MsgError> {
        let mut r = R { b, at: 0 };
        let c = match kind {
            CONTROL_BASE => {
                let pid = r.u64();
                let code = r.u8();
                let node = r.u8();
                if !matches!(code, REFUSE_NO_PAGE | REFUSE_READ | REFUSE_HOLDER_DEAD) {
                    return Err(bad(format!("refusal code {code} does not exist")));
                }
                if node as usize >= crate::pid::MAX_NODES {
                    return Err(bad(format!("refusal names node {node}")));
                }
                Control::Refuse { pid, code, node }
            }
            k if k == CONTROL_BASE + 1 => Control::Arrive {
                generation: r.u64(),
            },
            k if k == CONTROL_BASE + 2 => Control::Alloc { request: r.u64() },
            k if k == CONTROL_BASE + 3 => Control::Allocated {
                request: r.u64(),
                pid: r.u64(),
            },
            k if k == CONTROL_BASE + 4 => {
                let pid = r.u64();
                let node = r.u8();
                if node as usize >= crate::pid::MAX_NODES {
                    return Err(bad(format!("lost page names node {node}")));
                }
                Control::Lost { pid, node }
            }
            k if k == CONTROL_BASE + 5 => {
                let count = r.u32();
                if count == 0 || count as usize > BATCH_MAX {
                    return Err(bad(format!(
                        "a batch of {count} messages (1 to {BATCH_MAX} fit)"
                    )));
                }
                Control::Batch {
                    count: count as u16,
                }
            }
            k if k == CONTROL_BASE + 6 => Control::Unused { pid: r.u64() },
            k if k == CONTROL_BASE + 7 => Control::Room { frames: r.u64() },
            k if k == CONTROL_BASE + 8 => Control::LogFence { seq: r.u64() },
            k if k == CONTROL_BASE + 9 => Control::LogFenced { seq: r.u64() },
            k if k == CONTROL_BASE + 10 => Control::Ping { at: r.u64() },
            k if k == CONTROL_BASE + 11 => Control::Pong { at: r.u64() },
            k if k == CONTROL_BASE + 12 => Control::Found { pid: r.u64() },
            k if k == CONTROL_BASE + 13 => Control::FoundAck { pid: r.u64() },
            k if k == CONTROL_BASE + 14 => Control::Ask { pid: r.u64() },
            k if k == CONTROL_BASE + 15 => {
                let pid = r.u64();
                let holds = r.u8();
                if holds_of(holds).is_none() {
                    return Err(bad(format!("a census answer of {holds} (0 to 3 exist)")));
                }
                Control::Has { pid, holds }
            }
            k if k == CONTROL_BASE + 16 || k == CONTROL_BASE + 17 => {
                let node = r.u8();
                let seq = r.u64();
                if node as usize >= crate::pid::MAX_NODES {
                    return Err(bad(format!("a settle message names node {node}")));
                }
                if k == CONTROL_BASE + 16 {
                    Control::Settle { node, seq }
                } else {
                    let done = r.u8();
                    if done > 1 {
                        return Err(bad(format!("a settle answer of {done} (0 or 1 exist)")));
                    }
                    Control::Settled { node, seq, done }
                }
            }
            k => return Err(bad(format!("message kind {k} is not a control message"))),
        };
        r.end()?;
        Ok(c)
    }
}

/// The wire code of a census answer ([`Control::Has`]).
pub fn holds_code(h: Holds) -> u8 {
    match h {
        Holds::Nothing => 0,
        Holds::Shared => 1,
        Holds::Exclusive => 2,
        Holds::Busy => 3,
    }
}

/// The census answer a wire code stands for (`None`: no such code).
pub fn holds_of(code: u8) -> Option<Holds> {
    Some(match code {
        0 => Holds::Nothing,
        1 => Holds::Shared,
        2 => Holds::Exclusive,
        3 => Holds::Busy,
        _ => return None,
    })
}

/// Bytes of one message in a batch: `pid u64 | tag u8 | epoch u64`.
const BATCH_ENTRY: usize = 17;
/// Most messages one batch carries.
pub const BATCH_MAX: usize = PAGE_BYTES / BATCH_ENTRY;
const TAG_EVICT: u8 = 0;
const TAG_DECLINED: u8 = 1;
const TAG_ACCEPTED: u8 = 2;

/// Messages that may travel in a [`Control::Batch`]: an eviction notice without a page, an
/// eviction reply.
pub fn batchable<D>(m: &Msg<D>) -> bool {
    matches!(m, Msg::Evict { data: None, .. } | Msg::EvictReply { .. })
}

/// Pack `msgs` (each [`batchable`], at most [`BATCH_MAX`]) into a page; unused bytes are zero.
pub fn encode_batch(msgs: &[(u64, Msg<Attached>)]) -> Box<[u8; PAGE_BYTES]> {
    assert!(
        !msgs.is_empty() && msgs.len() <= BATCH_MAX,
        "batch of {}",
        msgs.len()
    );
    let mut page = Box::new([0u8; PAGE_BYTES]);
    for (e, (pid, m)) in page.chunks_exact_mut(BATCH_ENTRY).zip(msgs) {
        let (tag, epoch) = match m {
            Msg::Evict { epoch, data: None } => (TAG_EVICT, *epoch),
            Msg::EvictReply { accepted: false } => (TAG_DECLINED, 0),
            Msg::EvictReply { accepted: true } => (TAG_ACCEPTED, 0),
            other => panic!("{} does not travel in a batch", other.name()),
        };
        e[..8].copy_from_slice(&pid.to_le_bytes());
        e[8] = tag;
        e[9..].copy_from_slice(&epoch.to_le_bytes());
    }
    page
}

/// Unpack a batch of `count` messages; unknown tags, an epoch on a reply and bytes after the
/// last message that are not zero are errors (nothing of a bad batch is applied).
pub fn decode_batch(
    count: u16,
    page: &[u8; PAGE_BYTES],
) -> Result<Vec<(u64, Msg<Attached>)>, MsgError> {
    let count = count as usize;
    if count == 0 || count > BATCH_MAX {
        return Err(bad(format!("a batch of {count} messages")));
    }
    let (used, rest) = page.split_at(count * BATCH_ENTRY);
    if rest.iter().any(|&b| b != 0) {
        return Err(bad("bytes after a batch's last message".into()));
    }
    used.chunks_exact(BATCH_ENTRY)
        .enumerate()
        .map(|(i, e)| {
            let pid = LittleEndian::read_u64(e);
            let epoch = LittleEndian::read_u64(&e[9..]);
            let m = match (e[8], epoch) {
                (TAG_EVICT, epoch) => Msg::Evict { epoch, data: None },
                (TAG_DECLINED, 0) => Msg::EvictReply { accepted: false },
                (TAG_ACCEPTED, 0) => Msg::EvictReply { accepted: true },
                (tag, epoch) => {
                    return Err(bad(format!(
                        "batch message {i}: tag {tag} with epoch {epoch}"
                    )))
                }
            };
            Ok((pid, m))
        })
        .collect()
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
